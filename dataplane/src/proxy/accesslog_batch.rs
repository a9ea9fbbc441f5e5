//! The access log's queue: lines are appended, whole, to one shared batch of bytes that the
//! writer thread takes and writes at once, instead of one `String` and one channel send per
//! line. The writer wakes when a batch starts (then lingers a moment for more lines) or when
//! one reaches [`Tuning::batch_bytes`]; a line costs the request a lock and a copy, and at most
//! one wake-up per batch. The queue stays bounded in lines: past the limit a line is dropped
//! and counted, as is every line of a batch the output refused.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// When the writer writes what is queued.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Lines queued before new ones are dropped.
    pub(crate) lines: usize,
    /// A batch this large is written without lingering.
    pub(crate) batch_bytes: usize,
    /// How long the writer waits for more lines after the first of a batch.
    pub(crate) linger: Duration,
}

impl Tuning {
    /// The default batching, queueing at most `lines` lines.
    pub(crate) fn new(lines: usize) -> Tuning {
        Tuning { lines: lines.max(1), batch_bytes: 64 * 1024, linger: Duration::from_millis(5) }
    }
}

/// The lines waiting for the writer.
#[derive(Debug, Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: u64,
    /// The writer waits on the condition variable (so a line that needs it wakes it).
    asleep: bool,
    /// The writer lingers, waiting for more lines before it writes.
    lingering: bool,
    /// No more lines: write what is left and stop.
    closed: bool,
}

/// The queue the proxy and the writer thread share.
#[derive(Debug)]
pub(crate) struct Queue {
    pending: Mutex<Pending>,
    wake: Condvar,
    tuning: Tuning,
    dropped: Arc<AtomicU64>,
}

/// Where batches go: `Some(batch)` is written (`Err`: it was not); `None` comes before a batch
/// is taken off the queue, for the sink to get ready (open its output) while the lines still
/// count in the queue.
pub(crate) type Sink<'a> = dyn FnMut(Option<&[u8]>) -> std::io::Result<()> + 'a;

impl Queue {
    /// An empty queue counting dropped lines in `dropped`.
    pub(crate) fn new(tuning: Tuning, dropped: Arc<AtomicU64>) -> Queue {
        Queue { pending: Mutex::new(Pending::default()), wake: Condvar::new(), tuning, dropped }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `line` (whole lines, each with its newline); false when the queue is full (the
    /// line is dropped, and counted).
    pub(crate) fn push(&self, line: &[u8]) -> bool {
        let mut pending = self.lock();
        if pending.lines >= self.tuning.lines as u64 || pending.closed {
            drop(pending);
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "the access log writer is behind; lines were dropped");
            }
            return false;
        }
        let first = pending.bytes.is_empty();
        pending.bytes.extend_from_slice(line);
        pending.lines += 1;
        let wake = pending.asleep
            && ((first && !pending.lingering) || pending.bytes.len() >= self.tuning.batch_bytes);
        if wake {
            pending.asleep = false;
        }
        drop(pending);
        if wake {
            self.wake.notify_one();
        }
        true
    }

    /// Stops the writer once it has written what is queued.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// The writer thread's loop: waits for lines, writes each batch with one call to `sink`,
    /// counts the lines of a batch it refused as dropped. Returns when the queue is closed and
    /// empty.
    pub(crate) fn run(&self, sink: &mut Sink<'_>) {
        let mut spare = Vec::new();
        let mut ready = false;
        let mut pending = self.lock();
        loop {
            if pending.bytes.is_empty() {
                if pending.closed {
                    return;
                }
                pending.asleep = true;
                pending = self.wake.wait(pending).unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            if !ready {
                // The output may block (a FIFO without a reader): the lines stay in the queue.
                drop(pending);
                let _ = sink(None);
                ready = true;
                pending = self.lock();
                continue;
            }
            if !pending.closed && pending.bytes.len() < self.tuning.batch_bytes {
                // The first lines of a batch: give the others a moment to join them.
                pending.asleep = true;
                pending.lingering = true;
                let (next, _) = self
                    .wake
                    .wait_timeout(pending, self.tuning.linger)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                pending = next;
                pending.asleep = false;
                pending.lingering = false;
            }
            let mut batch = std::mem::replace(&mut pending.bytes, std::mem::take(&mut spare));
            let lines = std::mem::take(&mut pending.lines);
            drop(pending);
            ready = false;
            if sink(Some(&batch)).is_err() {
                self.dropped.fetch_add(lines, Ordering::Relaxed);
            }
            batch.clear();
            // Keep one batch's allocation for the next (a burst's is not kept for ever).
            if batch.capacity() <= 4 * self.tuning.batch_bytes {
                spare = batch;
            }
            pending = self.lock();
        }
    }
}

/// Writes `batch` to `out` and flushes it.
pub(crate) fn write_batch(out: &mut dyn Write, batch: &[u8]) -> std::io::Result<()> {
    out.write_all(batch)?;
    out.flush()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::mpsc;

    /// A queue with its writer thread sending each batch to the returned channel.
    fn started(tuning: Tuning) -> (Arc<Queue>, mpsc::Receiver<Vec<u8>>, std::thread::JoinHandle<()>) {
        let queue = Arc::new(Queue::new(tuning, Arc::new(AtomicU64::new(0))));
        let (tx, rx) = mpsc::channel();
        let q = queue.clone();
        let thread = std::thread::spawn(move || {
            q.run(&mut |batch: Option<&[u8]>| {
                if let Some(batch) = batch {
                    tx.send(batch.to_vec()).unwrap();
                }
                Ok(())
            });
        });
        (queue, rx, thread)
    }

    const WAIT: Duration = Duration::from_secs(30);

    #[test]
    fn a_lone_line_is_written_when_the_writer_is_idle() {
        let (queue, rx, thread) = started(Tuning::new(100));
        assert!(queue.push(b"one\n"));
        assert_eq!(rx.recv_timeout(WAIT).unwrap(), b"one\n");
        assert!(queue.push(b"two\n"));
        assert_eq!(rx.recv_timeout(WAIT).unwrap(), b"two\n");
        queue.close();
        thread.join().unwrap();
    }

    #[test]
    fn a_full_batch_is_written_without_waiting_for_its_linger() {
        // The writer would linger for an hour: only the batch's size makes it write.
        let tuning = Tuning { lines: 1000, batch_bytes: 40, linger: Duration::from_secs(3600) };
        let (queue, rx, thread) = started(tuning);
        for i in 0..8 {
            assert!(queue.push(format!("line {i}\n").as_bytes()));
        }
        let expected: String = (0..8).map(|i| format!("line {i}\n")).collect();
        // At least one batch's worth arrives while the writer would still be lingering.
        let mut written = Vec::new();
        while written.len() < 40 {
            written.extend(rx.recv_timeout(WAIT).unwrap());
        }
        let text = String::from_utf8(written).unwrap();
        assert!(expected.starts_with(&text) && text.ends_with('\n'), "{text:?}");
        // Closing writes the rest.
        queue.close();
        thread.join().unwrap();
        let rest: Vec<u8> = rx.try_iter().flatten().collect();
        assert_eq!(text + std::str::from_utf8(&rest).unwrap(), expected);
    }

    #[test]
    fn lines_past_the_limit_are_dropped_and_counted() {
        let dropped = Arc::new(AtomicU64::new(0));
        let queue = Queue::new(Tuning::new(3), dropped.clone());
        // No writer thread: nothing leaves the queue.
        let accepted = (0..5).filter(|i| queue.push(format!("{i}\n").as_bytes())).count();
        assert_eq!((accepted, dropped.load(Ordering::Relaxed)), (3, 2));
        // What was queued is written when the writer runs, then it stops (closed).
        queue.close();
        let mut written = Vec::new();
        queue.run(&mut |batch: Option<&[u8]>| {
            written.extend_from_slice(batch.unwrap_or_default());
            Ok(())
        });
        assert_eq!(written, b"0\n1\n2\n");
        assert!(!queue.push(b"late\n"), "closed");
        assert_eq!(dropped.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn the_lines_of_a_refused_batch_are_counted_as_dropped() {
        let dropped = Arc::new(AtomicU64::new(0));
        let queue = Queue::new(Tuning::new(10), dropped.clone());
        for line in [&b"a\n"[..], b"b\n", b"c\n"] {
            assert!(queue.push(line));
        }
        queue.close();
        queue.run(&mut |batch: Option<&[u8]>| match batch {
            Some(_) => Err(std::io::Error::other("disk full")),
            None => Ok(()),
        });
        assert_eq!(dropped.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn lines_from_concurrent_threads_are_never_split_nor_interleaved() {
        // Small batches, so that lines meet batch boundaries often.
        let tuning = Tuning { lines: 1 << 20, batch_bytes: 100, linger: Duration::from_millis(1) };
        let (queue, rx, thread) = started(tuning);
        let (threads, per_thread) = (4, 2000);
        let line =
            |t: usize, i: usize| format!("{{\"t\":{t},\"i\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 37));
        let producers: Vec<_> = (0..threads)
            .map(|t| {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    for i in 0..per_thread {
                        assert!(queue.push(line(t, i).as_bytes()));
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        queue.close();
        thread.join().unwrap();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut next = vec![0; threads];
        for batch in rx.try_iter() {
            assert!(batch.ends_with(b"\n"), "a batch ends with a whole line");
            for text in String::from_utf8(batch).unwrap().split_inclusive('\n') {
                let v: serde_json::Value = serde_json::from_str(text).unwrap();
                let (t, i) = (v["t"].as_u64().unwrap() as usize, v["i"].as_u64().unwrap() as usize);
                assert_eq!(text, line(t, i), "a line arrives whole");
                assert_eq!(i, next[t], "each thread's lines in its order");
                next[t] += 1;
                *seen.entry(text.to_string()).or_default() += 1;
            }
        }
        assert_eq!(next, vec![per_thread; threads], "every line arrives");
        assert!(seen.values().all(|n| *n == 1), "once");
    }
}
