//! nf_tables over netlink, without the `nft` tool: just what nftables mode writes.
//!
//! [`Expr`] is one nf_tables expression (what `nft --debug=netlink` prints), [`Batch`] a
//! transaction (`NFNL_MSG_BATCH_BEGIN` … `BATCH_END`) of table, chain, rule, set and element
//! messages, and [`Socket::commit`] sends it and reports the first error: the kernel applies a
//! batch whole or not at all. The expressions are the ones `nft` 1.0 generates for the same rules,
//! so that `nft list` prints weir's table as the text nftables mode renders (a test checks it).
//!
//! Skipping `nft` matters at scale: to add one element to an interval map, `nft` first fetches
//! the elements of every interval set of the table, and it parses 100,000 rules or elements
//! in about a second.

use std::net::IpAddr;

use super::netlink::{self, Attr, Value};

/// Errors of talking nf_tables.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket failed.
    #[error(transparent)]
    Netlink(#[from] netlink::Error),
    /// The kernel refused a message of the batch (nothing of the batch was applied).
    #[error("nf_tables refused {what}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Refused {
        /// The message, as nft text.
        what: String,
        /// The (positive) errno.
        errno: i32,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const MSG_NEWTABLE: u16 = 0;
const MSG_GETTABLE: u16 = 1;
const MSG_DELTABLE: u16 = 2;
const MSG_NEWCHAIN: u16 = 3;
const MSG_DELCHAIN: u16 = 5;
const MSG_NEWRULE: u16 = 6;
const MSG_DELRULE: u16 = 8;
const MSG_NEWSET: u16 = 9;
const MSG_DELSET: u16 = 11;
const MSG_NEWSETELEM: u16 = 12;
const MSG_DELSETELEM: u16 = 14;

const F_CREATE: u16 = 0x400;
const F_APPEND: u16 = 0x800;

/// `NFT_REG_VERDICT`.
pub const REG_VERDICT: u32 = 0;
/// `NFT_REG_1` (16 bytes; its first word is `NFT_REG32_00`).
pub const REG_1: u32 = 1;
/// `NFT_REG_2`.
pub const REG_2: u32 = 2;

/// The register `word` 32-bit words after the start of `NFT_REG_1`, named as nft names it: a
/// 16-byte register where one starts (`NFT_REG_1 + word / 4`), else `NFT_REG32_00 + word`.
pub fn reg_at(word: usize) -> u32 {
    let word = u32::try_from(word).unwrap_or(0);
    if word % 4 == 0 { REG_1 + word / 4 } else { 8 + word }
}

/// An nf_tables family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `ip` (`NFPROTO_IPV4`).
    Ip,
    /// `ip6` (`NFPROTO_IPV6`).
    Ip6,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Ip => 2,
            Family::Ip6 => 10,
        }
    }
}

/// Comparison operators of `cmp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// `==`.
    Eq = 0,
    /// `!=`.
    Neq = 1,
}

/// A verdict.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

impl Verdict {
    fn attrs(&self) -> Vec<Attr> {
        let (code, chain): (i32, Option<&String>) = match self {
            Verdict::Drop => (0, None),
            Verdict::Return => (-5, None),
            Verdict::Jump(c) => (-3, Some(c)),
            Verdict::Goto(c) => (-4, Some(c)),
        };
        let mut v = vec![be32(1, code as u32)];
        if let Some(c) = chain {
            v.push(Attr::new(2, Value::Str(c.clone())));
        }
        vec![Attr::new(2, Value::Nested(v))]
    }

    /// The nft text.
    pub fn text(&self) -> String {
        match self {
            Verdict::Drop => "drop".into(),
            Verdict::Return => "return".into(),
            Verdict::Jump(c) => format!("jump {c}"),
            Verdict::Goto(c) => format!("goto {c}"),
        }
    }
}

/// One nf_tables expression.
// The fields are the expressions' netlink attributes, named as in the kernel's uapi.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// `payload load LEN @ BASE + OFFSET => DREG` (base 1: network, 2: transport header).
    Payload { base: u32, offset: u32, len: u32, dreg: u32 },
    /// `meta load KEY => DREG`.
    Meta { key: u32, dreg: u32 },
    /// `meta set KEY with SREG`.
    MetaSet { key: u32, sreg: u32 },
    /// `ct load KEY => DREG`.
    Ct { key: u32, dreg: u32 },
    /// `cmp OP SREG DATA`.
    Cmp { sreg: u32, op: CmpOp, data: Vec<u8> },
    /// `bitwise REG = (REG & MASK) ^ XOR`.
    Bitwise { reg: u32, mask: Vec<u8>, xor: Vec<u8> },
    /// `lookup SREG set SET [dreg DREG]`.
    Lookup { set: String, sreg: u32, dreg: Option<u32> },
    /// `immediate reg 0 VERDICT`.
    Verdict(Verdict),
    /// `immediate DREG DATA`.
    Immediate { dreg: u32, data: Vec<u8> },
    /// `numgen DREG = random mod MODULUS offset OFFSET`.
    Numgen { dreg: u32, modulus: u32, offset: u32 },
    /// `byteorder REG = hton(REG, 4, 4)`.
    Hton32 { reg: u32 },
    /// `nat dnat FAMILY addr_min ADDR proto_min PROTO [flags]`.
    Dnat { family: Family, addr: u32, proto: u32, flags: Option<u32> },
    /// `masq flags 0x10` (fully-random).
    MasqFullyRandom,
    /// `reject type 0 code CODE` (ICMP port unreachable: 3 for IPv4, 4 for IPv6).
    Reject { code: u8 },
    /// `fib saddr/daddr type => DREG` (flags 1: saddr, 2: daddr).
    FibType { flags: u32, dreg: u32 },
    /// `dynset update reg_key SREG set SET`.
    DynsetUpdate { set: String, sreg: u32 },
}

fn be32(kind: u16, v: u32) -> Attr {
    Attr::new(kind, Value::Bytes(v.to_be_bytes().to_vec()))
}

fn data_value(kind: u16, bytes: &[u8]) -> Attr {
    Attr::new(kind, Value::Nested(vec![Attr::new(1, Value::Bytes(bytes.to_vec()))]))
}

impl Expr {
    fn encode(&self) -> Attr {
        let (name, attrs): (&str, Vec<Attr>) = match self {
            Expr::Payload { base, offset, len, dreg } => {
                ("payload", vec![be32(1, *dreg), be32(2, *base), be32(3, *offset), be32(4, *len)])
            }
            Expr::Meta { key, dreg } => ("meta", vec![be32(2, *key), be32(1, *dreg)]),
            Expr::MetaSet { key, sreg } => ("meta", vec![be32(2, *key), be32(3, *sreg)]),
            Expr::Ct { key, dreg } => ("ct", vec![be32(2, *key), be32(1, *dreg)]),
            Expr::Cmp { sreg, op, data } => {
                ("cmp", vec![be32(1, *sreg), be32(2, *op as u32), data_value(3, data)])
            }
            Expr::Bitwise { reg, mask, xor } => (
                "bitwise",
                vec![
                    be32(1, *reg),
                    be32(2, *reg),
                    be32(3, u32::try_from(mask.len()).unwrap_or(0)),
                    data_value(4, mask),
                    data_value(5, xor),
                ],
            ),
            Expr::Lookup { set, sreg, dreg } => {
                let mut v = vec![Attr::new(1, Value::Str(set.clone())), be32(2, *sreg)];
                if let Some(d) = dreg {
                    v.push(be32(3, *d));
                }
                ("lookup", v)
            }
            Expr::Verdict(verdict) => {
                ("immediate", vec![be32(1, REG_VERDICT), Attr::new(2, Value::Nested(verdict.attrs()))])
            }
            Expr::Immediate { dreg, data } => ("immediate", vec![be32(1, *dreg), data_value(2, data)]),
            Expr::Numgen { dreg, modulus, offset } => {
                ("numgen", vec![be32(1, *dreg), be32(2, *modulus), be32(3, 1), be32(4, *offset)])
            }
            // NFTA_BYTEORDER_SREG, DREG, OP (NFT_BYTEORDER_HTON = 1), LEN, SIZE.
            Expr::Hton32 { reg } => {
                ("byteorder", vec![be32(1, *reg), be32(2, *reg), be32(3, 1), be32(4, 4), be32(5, 4)])
            }
            Expr::Dnat { family, addr, proto, flags } => {
                let mut v =
                    vec![be32(1, 1), be32(2, u32::from(family.nfproto())), be32(3, *addr), be32(5, *proto)];
                if let Some(f) = flags {
                    v.push(be32(7, *f));
                }
                ("nat", v)
            }
            Expr::MasqFullyRandom => ("masq", vec![be32(1, 0x10)]),
            Expr::Reject { code } => ("reject", vec![be32(1, 0), Attr::new(2, Value::Bytes(vec![*code]))]),
            Expr::FibType { flags, dreg } => ("fib", vec![be32(1, *dreg), be32(2, 3), be32(3, *flags)]),
            Expr::DynsetUpdate { set, sreg } => {
                ("dynset", vec![Attr::new(1, Value::Str(set.clone())), be32(3, 1), be32(4, *sreg)])
            }
        };
        Attr::new(
            1,
            Value::Nested(vec![Attr::new(1, Value::Str(name.into())), Attr::new(2, Value::Nested(attrs))]),
        )
    }
}

/// An nftables userdata TLV list with one comment (type 0), as nft writes rule, element and
/// table comments.
fn comment_udata(comment: &str) -> Vec<u8> {
    let mut v = vec![0, u8::try_from(comment.len() + 1).unwrap_or(u8::MAX)];
    v.extend_from_slice(comment.as_bytes());
    v.push(0);
    v
}

/// The bytes of an address.
pub fn addr_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// A set's declaration, as nft 1.0 sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    /// `NFT_SET_*` flags.
    pub flags: u32,
    /// nft's key type id and length.
    pub key: (u32, u32),
    /// For maps: nft's data type id (`0xffffff00`: verdict) and length.
    pub data: Option<(u32, u32)>,
    /// Timeout in milliseconds (sets with `flags timeout`).
    pub timeout_ms: Option<u64>,
    /// nft's userdata (how `nft list` prints the types).
    pub udata: Vec<u8>,
}

/// One set element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    /// The key bytes (fields padded to 4 bytes).
    pub key: Vec<u8>,
    /// Map data: a verdict or bytes.
    pub data: Option<ElementData>,
    /// `NFT_SET_ELEM_INTERVAL_END`: the (exclusive) end of an interval.
    pub interval_end: bool,
    /// Its comment.
    pub comment: Option<String>,
}

/// The data of a map element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElementData {
    /// A verdict map's verdict.
    Verdict(Verdict),
    /// A data map's value.
    Value(Vec<u8>),
}

impl Element {
    fn encode(&self, with_data: bool) -> Attr {
        let mut v = vec![data_value(1, &self.key)];
        if self.interval_end {
            v.push(be32(3, 1));
        }
        if with_data {
            match &self.data {
                Some(ElementData::Verdict(verdict)) => v.push(Attr::new(2, Value::Nested(verdict.attrs()))),
                Some(ElementData::Value(bytes)) => v.push(data_value(2, bytes)),
                None => {}
            }
            if let Some(c) = &self.comment {
                v.push(Attr::new(6, Value::Bytes(comment_udata(c))));
            }
        }
        Attr::new(1, Value::Nested(v))
    }
}

/// A base chain's hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    /// `nat` or `filter`.
    pub kind: &'static str,
    /// `NF_INET_*` hook number.
    pub hooknum: u32,
    /// Priority.
    pub priority: i32,
}

/// Element bytes per `NEWSETELEM` message (attribute lengths are 16-bit).
const ELEMENT_BYTES_PER_MESSAGE: usize = 32 * 1024;

/// A transaction being built: messages, each with a description for error reports.
#[derive(Debug)]
pub struct Batch {
    family: Family,
    table: String,
    messages: Vec<(u16, u16, Vec<Attr>, String)>,
}

impl Batch {
    /// An empty transaction on `table` of `family`.
    pub fn new(family: Family, table: &str) -> Self {
        Batch { family, table: table.into(), messages: Vec::new() }
    }

    /// Messages so far.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn table_attr(&self, kind: u16) -> Attr {
        Attr::new(kind, Value::Str(self.table.clone()))
    }

    fn push(&mut self, msg: u16, flags: u16, attrs: Vec<Attr>, what: String) {
        self.messages.push((msg, flags, attrs, what));
    }

    /// `add table` (with a comment).
    pub fn add_table(&mut self, comment: Option<&str>) {
        let mut attrs = vec![self.table_attr(1), be32(2, 0)];
        if let Some(c) = comment {
            attrs.push(Attr::new(6, Value::Bytes(comment_udata(c))));
        }
        self.push(MSG_NEWTABLE, F_CREATE, attrs, format!("add table {}", self.table));
    }

    /// `delete table`.
    pub fn delete_table(&mut self) {
        let attrs = vec![self.table_attr(1)];
        self.push(MSG_DELTABLE, 0, attrs, format!("delete table {}", self.table));
    }

    /// `add chain`, a base chain with `hook` (policy accept).
    pub fn add_chain(&mut self, name: &str, hook: Option<Hook>) {
        let mut attrs = vec![self.table_attr(1), Attr::new(3, Value::Str(name.into()))];
        if let Some(h) = hook {
            attrs.push(Attr::new(4, Value::Nested(vec![be32(1, h.hooknum), be32(2, h.priority as u32)])));
            attrs.push(be32(5, 1));
            attrs.push(Attr::new(7, Value::Str(h.kind.into())));
        }
        self.push(MSG_NEWCHAIN, F_CREATE, attrs, format!("add chain {name}"));
    }

    /// `flush chain`.
    pub fn flush_chain(&mut self, name: &str) {
        let attrs = vec![self.table_attr(1), Attr::new(2, Value::Str(name.into()))];
        self.push(MSG_DELRULE, 0, attrs, format!("flush chain {name}"));
    }

    /// `delete chain`.
    pub fn delete_chain(&mut self, name: &str) {
        let attrs = vec![self.table_attr(1), Attr::new(3, Value::Str(name.into()))];
        self.push(MSG_DELCHAIN, 0, attrs, format!("delete chain {name}"));
    }

    /// `add rule` at the end of `chain`.
    pub fn add_rule(&mut self, chain: &str, exprs: &[Expr], comment: Option<&str>, text: &str) {
        let mut attrs = vec![
            self.table_attr(1),
            Attr::new(2, Value::Str(chain.into())),
            Attr::new(4, Value::Nested(exprs.iter().map(Expr::encode).collect())),
        ];
        if let Some(c) = comment {
            attrs.push(Attr::new(7, Value::Bytes(comment_udata(c))));
        }
        self.push(MSG_NEWRULE, F_CREATE | F_APPEND, attrs, format!("add rule {chain} {text}"));
    }

    /// `add set` / `add map`.
    pub fn add_set(&mut self, name: &str, spec: &SetSpec) {
        let mut attrs = vec![
            self.table_attr(1),
            Attr::new(2, Value::Str(name.into())),
            be32(3, spec.flags),
            be32(4, spec.key.0),
            be32(5, spec.key.1),
        ];
        if let Some((t, l)) = spec.data {
            attrs.push(be32(6, t));
            attrs.push(be32(7, l));
        }
        // Required (sets of one batch can be referred to by id); weir refers to them by name.
        let id = u32::try_from(self.messages.len()).unwrap_or(u32::MAX);
        attrs.push(be32(10, id));
        if let Some(ms) = spec.timeout_ms {
            attrs.push(Attr::new(11, Value::Bytes(ms.to_be_bytes().to_vec())));
        }
        attrs.push(Attr::new(13, Value::Bytes(spec.udata.clone())));
        self.push(MSG_NEWSET, F_CREATE, attrs, format!("add set {name}"));
    }

    /// `delete set`.
    pub fn delete_set(&mut self, name: &str) {
        let attrs = vec![self.table_attr(1), Attr::new(2, Value::Str(name.into()))];
        self.push(MSG_DELSET, 0, attrs, format!("delete set {name}"));
    }

    fn elements(&mut self, msg: u16, set: &str, elements: &[Element], add: bool) {
        let verb = if add { "add" } else { "delete" };
        let mut chunk: Vec<Attr> = Vec::new();
        let mut size = 0;
        let flush = |chunk: &mut Vec<Attr>, this: &mut Self| {
            if chunk.is_empty() {
                return;
            }
            let attrs = vec![
                this.table_attr(1),
                Attr::new(2, Value::Str(set.into())),
                Attr::new(3, Value::Nested(std::mem::take(chunk))),
            ];
            let what = format!("{verb} element {set} (one of {} elements)", elements.len());
            this.push(msg, if add { F_CREATE } else { 0 }, attrs, what);
        };
        for e in elements {
            let attr = e.encode(add);
            let mut bytes = Vec::new();
            netlink::put_attr(&mut bytes, &attr);
            if size + bytes.len() > ELEMENT_BYTES_PER_MESSAGE {
                flush(&mut chunk, self);
                size = 0;
            }
            size += bytes.len();
            chunk.push(attr);
        }
        flush(&mut chunk, self);
    }

    /// `add element`.
    pub fn add_elements(&mut self, set: &str, elements: &[Element]) {
        self.elements(MSG_NEWSETELEM, set, elements, true);
    }

    /// `delete element` (keys only).
    pub fn delete_elements(&mut self, set: &str, elements: &[Element]) {
        self.elements(MSG_DELSETELEM, set, elements, false);
    }

    /// The wire form: batch begin, the messages with sequence numbers from `first_seq`, batch
    /// end; the last message asks for an acknowledgement.
    pub fn encode(&self, first_seq: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let start = out.len();
        header(&mut out, NFNL_MSG_BATCH_BEGIN, 0, first_seq, 0, NFNL_SUBSYS_NFTABLES);
        finish(&mut out, start);
        let last = self.messages.len();
        for (i, (msg, flags, attrs, _)) in self.messages.iter().enumerate() {
            let start = out.len();
            let ack = if i + 1 == last { netlink::F_ACK } else { 0 };
            let seq = first_seq.wrapping_add(1 + u32::try_from(i).unwrap_or(0));
            header(&mut out, NFNL_SUBSYS_NFTABLES << 8 | msg, flags | ack, seq, self.family.nfproto(), 0);
            for a in attrs {
                netlink::put_attr(&mut out, a);
            }
            finish(&mut out, start);
        }
        let start = out.len();
        let end_seq = first_seq.wrapping_add(1 + u32::try_from(last).unwrap_or(0));
        header(&mut out, NFNL_MSG_BATCH_END, 0, end_seq, 0, NFNL_SUBSYS_NFTABLES);
        finish(&mut out, start);
        out
    }
}

/// Appends an `nlmsghdr` (its length left 0 for [`finish`]) and an `nfgenmsg`.
fn header(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&(flags | netlink::F_REQUEST).to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[family, 0]);
    out.extend_from_slice(&res_id.to_be_bytes());
}

/// Writes the length of the message that starts at `start`.
fn finish(out: &mut [u8], start: usize) {
    let len = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

// === the socket ===

/// A `NETLINK_NETFILTER` socket in one network namespace.
#[derive(Debug)]
pub struct Socket {
    socket: netlink::Socket,
}

impl Socket {
    /// Opens a socket in the namespace `netns` (under `/run/netns`), or in this process's.
    pub fn open(netns: Option<&str>) -> Result<Self> {
        Ok(Socket { socket: netlink::Socket::open_protocol(netlink::NETLINK_NETFILTER, netns)? })
    }

    /// Whether the table `table` of `family` exists (`NFT_MSG_GETTABLE`: the table, or ENOENT).
    pub fn table_exists(&mut self, family: Family, table: &str) -> Result<bool> {
        const ENOENT: i32 = 2;
        let seq = self.socket.next_seq();
        let mut out = Vec::new();
        let kind = NFNL_SUBSYS_NFTABLES << 8 | MSG_GETTABLE;
        header(&mut out, kind, netlink::F_ACK, seq, family.nfproto(), 0);
        netlink::put_attr(&mut out, &Attr::new(1, Value::Str(table.into())));
        finish(&mut out, 0);
        self.socket.send_raw(&out)?;
        let mut found = false;
        loop {
            for frame in self.socket.recv_frames(&|_, _| netlink::Kind::Bytes)? {
                match frame {
                    netlink::Frame::Message(m) if m.seq == seq => found = true,
                    netlink::Frame::Error { seq: s, errno: 0 } if s == seq => return Ok(found),
                    netlink::Frame::Error { seq: s, errno: ENOENT } if s == seq => return Ok(false),
                    netlink::Frame::Error { seq: s, errno } if s == seq => {
                        return Err(Error::Refused { what: format!("list table {table}"), errno });
                    }
                    _ => {}
                }
            }
        }
    }

    /// Deletes the table `table` of `family` with everything in it; nothing when it does not
    /// exist (`add table` first, in the same transaction, as `nft` users write it).
    pub fn delete_table(&mut self, family: Family, table: &str) -> Result<()> {
        let mut batch = Batch::new(family, table);
        batch.add_table(None);
        batch.delete_table();
        self.commit(&batch)
    }

    /// Sends `batch` as one transaction and waits for the kernel's answer: the first refused
    /// message is reported (the kernel then applied nothing).
    pub fn commit(&mut self, batch: &Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let first = self.socket.next_seq();
        let n = u32::try_from(batch.messages.len()).unwrap_or(u32::MAX);
        // Reserve the batch's sequence numbers.
        for _ in 0..=n {
            self.socket.next_seq();
        }
        self.socket.send_raw(&batch.encode(first))?;
        let last = first.wrapping_add(n);
        let mut refused: Option<(u32, i32)> = None;
        loop {
            for frame in self.socket.recv_frames(&|_, _| netlink::Kind::Bytes)? {
                let netlink::Frame::Error { seq, errno } = frame else { continue };
                if seq == first && errno != 0 {
                    // An error about the batch as a whole (such as ENOMEM).
                    return Err(Error::Refused { what: "the batch".into(), errno });
                }
                let index = seq.wrapping_sub(first).wrapping_sub(1);
                if index >= n {
                    continue;
                }
                if errno != 0 && refused.is_none() {
                    refused = Some((index, errno));
                }
                if seq == last {
                    return match refused {
                        None => Ok(()),
                        Some((i, errno)) => Err(Error::Refused {
                            what: batch.messages.get(i as usize).map(|m| m.3.clone()).unwrap_or_default(),
                            errno,
                        }),
                    };
                }
            }
        }
    }
}
