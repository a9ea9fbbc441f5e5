//! The hot-swap test: clients hammer the proxy while 200 different tables are published; not one
//! request may fail, and every answer must match exactly one published table.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use support::*;
use weir_dataplane::model::RouteTable;
use weir_dataplane::model::changes::TableChanges;

const ECHOS: usize = 8;
const HOSTS: usize = 4;
const TABLES: usize = 200;
const CLIENTS: usize = 8;

/// Table `k` sends host `h{i}.test` to backend `t{k}-h{i}` (ids differ per table, so a router
/// of one table paired with the backends of another could not resolve them) whose only endpoint
/// is echo `(k + i) % ECHOS`; it also has an exact route `/k` answered by the same backend.
fn table_k(k: usize, echos: &[Echo]) -> RouteTable {
    let mut t = table();
    for i in 0..HOSTS {
        let e = &echos[expected(k, i)];
        let be = backend(&format!("t{k}-h{i}"), &[e.addr]);
        t = t.host(&format!("h{i}.test")).prefix("/", &be).exact(&format!("/only-{k}"), &be);
    }
    t.build()
}

fn expected(k: usize, host: usize) -> usize {
    (k + host) % ECHOS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_swap_under_load_never_fails_nor_mixes_tables() {
    hot_swap(false).await;
}

/// The same with each table published as its changes from the one before
/// ([`weir_dataplane::proxy::Proxy::publish_changes`]): only what changed is compiled, the
/// rest shared with the live table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn incremental_hot_swap_under_load_never_fails_nor_mixes_tables() {
    hot_swap(true).await;
}

async fn hot_swap(incremental: bool) {
    let mut echos = Vec::new();
    for n in 0..ECHOS {
        echos.push(echo(&format!("e{n}")).await);
    }
    let echos = Arc::new(echos);
    let p = Arc::new(proxy(table_k(0, &echos)).await);
    // A fresh proxy stamps versions 1, 2, ...: version v serves table k = v - 1.
    assert_eq!(p.proxy.version(), 1);

    let done = Arc::new(AtomicBool::new(false));
    let (requests, decisive) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (p, done, requests, decisive) = (p.clone(), done.clone(), requests.clone(), decisive.clone());
        clients.push(tokio::spawn(async move {
            let mut n = c;
            while !done.load(Relaxed) {
                let host = n % HOSTS;
                n += 1;
                let before = p.proxy.version() as usize;
                let r = p.get(&format!("h{host}.test"), "/").await;
                let after = p.proxy.version() as usize;
                assert_eq!(r.status, 200, "request failed mid-swap: {}", r.text());
                let name = r.name();
                let got: usize = name.trim_start_matches('e').parse().unwrap();
                // The request saw one table k with before - 1 <= k <= after - 1.
                let consistent = (before - 1..after).any(|k| expected(k, host) == got);
                assert!(
                    consistent,
                    "h{host} answered by {name}, no table in versions {before}..={after} says so"
                );
                if after - before + 1 < ECHOS {
                    decisive.fetch_add(1, Relaxed); // some echo would have been wrong
                }
                requests.fetch_add(1, Relaxed);
            }
        }));
    }

    for k in 1..TABLES {
        let table = table_k(k, &echos);
        let v = if incremental {
            let changes = TableChanges::between(&table_k(k - 1, &echos), &table);
            p.proxy.publish_changes(&table, Some(&changes)).unwrap()
        } else {
            p.proxy.publish(table).unwrap()
        };
        assert_eq!(v as usize, k + 1);
        // Once published, the table's own route answers at once.
        let host = k % HOSTS;
        let r = p.get(&format!("h{host}.test"), &format!("/only-{k}")).await;
        assert_eq!(r.name(), format!("e{}", expected(k, host)));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    done.store(true, Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let (requests, decisive) = (requests.load(Relaxed), decisive.load(Relaxed));
    eprintln!("{requests} requests during {TABLES} swaps, {decisive} decisive checks");
    assert!(requests >= TABLES, "only {requests} requests overlapped the swaps");
    assert!(decisive * 2 >= requests, "most checks must rule out some answer ({decisive}/{requests})");
    // An old table's exact route is gone: the last table's prefix answers it.
    assert_eq!(p.get("h0.test", "/only-1").await.name(), format!("e{}", expected(TABLES - 1, 0)));
}
