//! A small generic-netlink encoder, decoder and socket: just what IPVS mode needs.
//!
//! Messages are plain data ([`Message`] of [`Attr`]s) so that the IPVS plan is pure and can be
//! compared with recorded fixtures; [`encode`] and [`decode`] convert to and from the wire
//! (`nlmsghdr` + `genlmsghdr` + attributes, native byte order, 4-byte alignment), and
//! [`Socket`] talks to the kernel (`NETLINK_GENERIC`), resolving family names with
//! `CTRL_CMD_GETFAMILY`. The socket is opened with `socket2` (no unsafe code): a netlink socket
//! that is never bound is bound by the kernel on first send, and sends go to the kernel.

use std::io::Read as _;
use std::time::Duration;

/// `NLM_F_REQUEST`.
pub const F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: part of a multi-part answer.
pub const F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`: ask for an acknowledgement.
pub const F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const F_DUMP: u16 = 0x300;
/// `NLA_F_NESTED`, set on the type of nested attributes.
pub const NLA_F_NESTED: u16 = 0x8000;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// `GENL_ID_CTRL`, the family of the generic netlink controller.
pub const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_NEWFAMILY: u8 = 1;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const NETLINK_GENERIC: i32 = 16;
/// `NETLINK_NETFILTER`: nfnetlink (nf_tables).
pub const NETLINK_NETFILTER: i32 = 12;
const AF_NETLINK: i32 = 16;
const SOCK_RAW: i32 = 3;

/// Errors of netlink encoding and of talking to the kernel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Socket I/O failed.
    #[error("netlink socket: {0}")]
    Io(#[from] std::io::Error),
    /// The kernel answered a request with an error.
    #[error("netlink {what}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Kernel {
        /// What was asked.
        what: String,
        /// The (positive) errno.
        errno: i32,
    },
    /// A message does not parse.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
    /// The generic netlink family does not exist (its module is not loaded).
    #[error("generic netlink family {0:?} not found (is its kernel module loaded?)")]
    NoFamily(String),
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An attribute value, typed so that fixtures read well.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `u16`, native byte order.
    U16(u16),
    /// `u32`, native byte order.
    U32(u32),
    /// `u16` in network byte order (ports).
    Be16(u16),
    /// A NUL-terminated string.
    Str(String),
    /// Raw bytes (addresses, structs).
    Bytes(Vec<u8>),
    /// Nested attributes.
    Nested(Vec<Attr>),
}

/// One netlink attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Its type (without `NLA_F_NESTED`).
    pub kind: u16,
    /// Its value.
    pub value: Value,
}

impl Attr {
    /// An attribute.
    pub fn new(kind: u16, value: Value) -> Self {
        Attr { kind, value }
    }

    /// The first nested attribute of type `kind`, if this is a nest.
    pub fn get(&self, kind: u16) -> Option<&Attr> {
        match &self.value {
            Value::Nested(attrs) => attrs.iter().find(|a| a.kind == kind),
            _ => None,
        }
    }
}

/// A generic netlink message: command, header flags and attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The generic netlink command.
    pub cmd: u8,
    /// The family's version (`genlmsghdr.version`).
    pub version: u8,
    /// `nlmsghdr` flags (`F_REQUEST | F_ACK`, ...).
    pub flags: u16,
    /// The attributes.
    pub attrs: Vec<Attr>,
}

impl Message {
    /// The first top-level attribute of type `kind`.
    pub fn get(&self, kind: u16) -> Option<&Attr> {
        self.attrs.iter().find(|a| a.kind == kind)
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends the wire form of `attr` (padded to 4 bytes) to `out`.
pub fn put_attr(out: &mut Vec<u8>, attr: &Attr) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut kind = attr.kind;
    match &attr.value {
        Value::U16(v) => out.extend_from_slice(&v.to_ne_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_ne_bytes()),
        Value::Be16(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Str(s) => {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        Value::Bytes(b) => out.extend_from_slice(b),
        Value::Nested(attrs) => {
            kind |= NLA_F_NESTED;
            for a in attrs {
                put_attr(out, a);
            }
        }
    }
    // Attribute lengths fit in u16 by construction (callers keep messages small).
    let len = u16::try_from(out.len() - start).unwrap_or(u16::MAX);
    out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    out[start + 2..start + 4].copy_from_slice(&kind.to_ne_bytes());
    out.resize(align4(out.len()), 0);
}

/// The wire form of `msg` for family `family` with sequence number `seq` (port id 0).
pub fn encode(msg: &Message, family: u16, seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&[0; 4]); // length, below
    out.extend_from_slice(&family.to_ne_bytes());
    out.extend_from_slice(&msg.flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[msg.cmd, msg.version, 0, 0]);
    for a in &msg.attrs {
        put_attr(&mut out, a);
    }
    let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
    out[0..4].copy_from_slice(&len.to_ne_bytes());
    out
}

/// How to read the payload of an attribute: a schema maps (nest, type) to this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// [`Value::U16`].
    U16,
    /// [`Value::U32`].
    U32,
    /// [`Value::Be16`].
    Be16,
    /// [`Value::Str`].
    Str,
    /// [`Value::Bytes`].
    Bytes,
    /// [`Value::Nested`], with the nest's id for the schema.
    Nested(u16),
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_ne_bytes)
        .ok_or_else(|| Error::Malformed(format!("truncated at byte {at}")))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| Error::Malformed(format!("truncated at byte {at}")))
}

/// Parses attributes; `schema(nest, kind)` says how to read each (`nest` 0 is the top level).
pub fn decode_attrs(mut b: &[u8], nest: u16, schema: &dyn Fn(u16, u16) -> Kind) -> Result<Vec<Attr>> {
    let mut attrs = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16_at(b, 0)?);
        let kind = u16_at(b, 2)? & !NLA_F_NESTED & 0x3fff;
        if len < 4 || len > b.len() {
            return Err(Error::Malformed(format!("attribute {kind} of length {len} in {} bytes", b.len())));
        }
        let payload = &b[4..len];
        let fixed = |n: usize| {
            if payload.len() == n {
                Ok(())
            } else {
                Err(Error::Malformed(format!("attribute {kind}: {} bytes, expected {n}", payload.len())))
            }
        };
        let value = match schema(nest, kind) {
            Kind::U16 => {
                fixed(2)?;
                Value::U16(u16_at(payload, 0)?)
            }
            Kind::U32 => {
                fixed(4)?;
                Value::U32(u32_at(payload, 0)?)
            }
            Kind::Be16 => {
                fixed(2)?;
                Value::Be16(u16::from_be_bytes([payload[0], payload[1]]))
            }
            Kind::Str => {
                let s = payload.split(|c| *c == 0).next().unwrap_or_default();
                Value::Str(String::from_utf8_lossy(s).into_owned())
            }
            Kind::Bytes => Value::Bytes(payload.to_vec()),
            Kind::Nested(id) => Value::Nested(decode_attrs(payload, id, schema)?),
        };
        attrs.push(Attr { kind, value });
        b = &b[align4(len).min(b.len())..];
    }
    Ok(attrs)
}

/// A decoded message with its header fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// `nlmsghdr.nlmsg_type`: the family id (or `NLMSG_ERROR`, `NLMSG_DONE`).
    pub family: u16,
    /// The sequence number.
    pub seq: u32,
    /// The message.
    pub message: Message,
}

/// Splits a buffer of netlink messages; generic ones are decoded with `schema`, errors and
/// `NLMSG_DONE` are returned as [`Frame::Error`] and [`Frame::Done`].
pub fn decode(mut b: &[u8], schema: &dyn Fn(u16, u16) -> Kind) -> Result<Vec<Frame>> {
    let mut frames = Vec::new();
    while b.len() >= 16 {
        let len = usize::try_from(u32_at(b, 0)?).unwrap_or(usize::MAX);
        if len < 16 || len > b.len() {
            return Err(Error::Malformed(format!("message of length {len} in {} bytes", b.len())));
        }
        let family = u16_at(b, 4)?;
        let flags = u16_at(b, 6)?;
        let seq = u32_at(b, 8)?;
        let body = &b[16..len];
        frames.push(match family {
            NLMSG_ERROR => {
                let code = u32_at(body, 0)? as i32;
                Frame::Error { seq, errno: -code }
            }
            NLMSG_DONE => Frame::Done { seq },
            _ => {
                if body.len() < 4 {
                    return Err(Error::Malformed("generic message without genlmsghdr".into()));
                }
                let attrs = decode_attrs(&body[4..], 0, schema)?;
                Frame::Message(Decoded {
                    family,
                    seq,
                    message: Message { cmd: body[0], version: body[1], flags, attrs },
                })
            }
        });
        b = &b[align4(len).min(b.len())..];
    }
    Ok(frames)
}

/// One netlink message as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A generic netlink message.
    Message(Decoded),
    /// An error (errno 0: an acknowledgement).
    Error {
        /// The request's sequence number.
        seq: u32,
        /// The positive errno, 0 for an ACK.
        errno: i32,
    },
    /// The end of a dump.
    Done {
        /// The request's sequence number.
        seq: u32,
    },
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// === the socket ===

/// A `NETLINK_GENERIC` socket.
#[derive(Debug)]
pub struct Socket {
    socket: socket2::Socket,
    seq: u32,
    buf: Vec<u8>,
}

fn ctrl_schema(nest: u16, kind: u16) -> Kind {
    match (nest, kind) {
        (0, CTRL_ATTR_FAMILY_ID) => Kind::U16,
        (0, CTRL_ATTR_FAMILY_NAME) => Kind::Str,
        _ => Kind::Bytes,
    }
}

impl Socket {
    /// Opens a socket (answers wait at most 5 s).
    pub fn open() -> Result<Self> {
        Self::open_protocol(NETLINK_GENERIC, None)
    }

    /// Opens a socket of netlink `protocol` (such as [`NETLINK_NETFILTER`]) in the network
    /// namespace `netns` (a name under `/run/netns`, as `ip netns` makes), or in this process's.
    /// A netlink socket stays in the namespace it was made in: a short-lived thread enters
    /// `netns`, makes it, and ends.
    pub fn open_protocol(protocol: i32, netns: Option<&str>) -> Result<Self> {
        let make = move || -> Result<socket2::Socket> {
            let socket = socket2::Socket::new(
                socket2::Domain::from(AF_NETLINK),
                socket2::Type::from(SOCK_RAW),
                Some(socket2::Protocol::from(protocol)),
            )?;
            socket.set_read_timeout(Some(Duration::from_secs(30)))?;
            Ok(socket)
        };
        let socket = match netns {
            None => make()?,
            Some(name) => {
                let path = std::path::Path::new("/run/netns").join(name);
                std::thread::scope(|scope| {
                    scope
                        .spawn(|| {
                            let ns = std::fs::File::open(&path)?;
                            rustix::thread::move_into_link_name_space(
                                std::os::fd::AsFd::as_fd(&ns),
                                Some(rustix::thread::LinkNameSpaceType::Network),
                            )
                            .map_err(std::io::Error::from)?;
                            make()
                        })
                        .join()
                        .unwrap_or_else(|_| Err(Error::Malformed("netns thread panicked".into())))
                })?
            }
        };
        Ok(Socket { socket, seq: 1, buf: vec![0; 1 << 20] })
    }

    /// A fresh sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `bytes` (one or more messages) in one datagram, growing the send buffer to fit
    /// (as root, past `net.core.wmem_max`: a batch must reach the kernel whole).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        let want = bytes.len() + 4096;
        if self.socket.send_buffer_size()? < want
            && rustix::net::sockopt::set_socket_send_buffer_size_force(&self.socket, want).is_err()
        {
            self.socket.set_send_buffer_size(want)?;
        }
        let sent = self.socket.send(bytes)?;
        if sent != bytes.len() {
            return Err(Error::Malformed(format!("sent {sent} of {} bytes", bytes.len())));
        }
        Ok(())
    }

    /// Receives one datagram and splits it into frames (messages decoded with `schema`).
    pub fn recv_frames(&mut self, schema: &dyn Fn(u16, u16) -> Kind) -> Result<Vec<Frame>> {
        let n = self.socket.read(&mut self.buf)?;
        decode(&self.buf[..n], schema)
    }

    /// The id of the generic netlink family `name` (`CTRL_CMD_GETFAMILY`).
    pub fn resolve(&mut self, name: &str) -> Result<u16> {
        let msg = Message {
            cmd: CTRL_CMD_GETFAMILY,
            version: 1,
            flags: F_REQUEST,
            attrs: vec![Attr::new(CTRL_ATTR_FAMILY_NAME, Value::Str(name.into()))],
        };
        let answers = match self.request(&msg, GENL_ID_CTRL, &ctrl_schema, "CTRL_CMD_GETFAMILY") {
            Err(Error::Kernel { errno: 2, .. }) => return Err(Error::NoFamily(name.into())),
            other => other?,
        };
        answers
            .iter()
            .filter(|m| m.cmd == CTRL_CMD_NEWFAMILY)
            .find_map(|m| match m.get(CTRL_ATTR_FAMILY_ID).map(|a| &a.value) {
                Some(Value::U16(id)) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| Error::Malformed(format!("no family id in the answer for {name:?}")))
    }

    /// Sends `msg` to `family` and collects the answer: the messages of a dump (with
    /// `F_DUMP`), or nothing after the acknowledgement (with `F_ACK`). A kernel error is
    /// returned as [`Error::Kernel`] naming `what`.
    pub fn request(
        &mut self,
        msg: &Message,
        family: u16,
        schema: &dyn Fn(u16, u16) -> Kind,
        what: &str,
    ) -> Result<Vec<Message>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        self.socket.send(&encode(msg, family, seq))?;
        let mut out = Vec::new();
        let dump = msg.flags & F_DUMP == F_DUMP;
        loop {
            let n = self.socket.read(&mut self.buf)?;
            let mut more = false;
            for frame in decode(&self.buf[..n], schema)? {
                match frame {
                    Frame::Error { seq: s, .. } | Frame::Done { seq: s } if s != seq => {}
                    Frame::Error { errno: 0, .. } => return Ok(out),
                    Frame::Error { errno, .. } => return Err(Error::Kernel { what: what.into(), errno }),
                    Frame::Done { .. } => return Ok(out),
                    Frame::Message(d) if d.seq == seq => {
                        more |= d.message.flags & F_MULTI != 0;
                        out.push(d.message);
                    }
                    Frame::Message(_) => {}
                }
            }
            // A single answer without ACK requested (GETFAMILY) ends here.
            if !dump && !more && msg.flags & F_ACK == 0 && !out.is_empty() {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trip() {
        let msg = Message {
            cmd: 1,
            version: 1,
            flags: F_REQUEST | F_ACK,
            attrs: vec![Attr::new(
                1,
                Value::Nested(vec![
                    Attr::new(1, Value::U16(2)),
                    Attr::new(4, Value::Be16(80)),
                    Attr::new(6, Value::Str("rr".into())),
                    Attr::new(3, Value::Bytes(vec![10, 96, 0, 10])),
                ]),
            )],
        };
        let bytes = encode(&msg, 0x1d, 7);
        assert_eq!(bytes.len() % 4, 0);
        let schema = |nest: u16, kind: u16| match (nest, kind) {
            (0, 1) => Kind::Nested(1),
            (1, 1) => Kind::U16,
            (1, 4) => Kind::Be16,
            (1, 6) => Kind::Str,
            _ => Kind::Bytes,
        };
        let frames = decode(&bytes, &schema).unwrap();
        assert_eq!(frames, vec![Frame::Message(Decoded { family: 0x1d, seq: 7, message: msg })]);
        // The port attribute: length 6, type 4, 80 in network order.
        assert!(hex(&bytes).contains("060004000050"), "{}", hex(&bytes));
    }

    /// The real kernel: `nlctrl` resolves to its fixed id; a family that does not exist is
    /// reported as such (on this machine "IPVS" is such a family: its kernel has no IPVS).
    /// Names are at most 15 bytes (`GENL_NAMSIZ`), or the kernel answers EINVAL.
    #[test]
    fn resolves_families_with_the_kernel() {
        let Ok(mut socket) = Socket::open() else {
            eprintln!("SKIPPED: cannot open a netlink socket");
            return;
        };
        assert_eq!(socket.resolve("nlctrl").unwrap(), GENL_ID_CTRL);
        match socket.resolve("weir-nofamily") {
            Err(Error::NoFamily(name)) => assert_eq!(name, "weir-nofamily"),
            other => panic!("{other:?}"),
        }
        if !std::path::Path::new("/proc/net/ip_vs").exists() {
            assert!(matches!(socket.resolve("IPVS"), Err(Error::NoFamily(_))));
        }
    }
}
