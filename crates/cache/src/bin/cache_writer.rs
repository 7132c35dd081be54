//! Test helper for `tests/kill9.rs`, not a product: writes to a `SledStore` forever, the way the
//! proxy would, until it is SIGKILLed. Usage: `cache-writer <cache-dir> <compact-every> sync|batched`
//! (`sync` = `SledOptions::sync_every_write`, the default; `batched` = background flushes).
//!
//! Each iteration relists scope A (namespace `a`; the item count varies so relists add and drop
//! members, and every item carries the list RV it belongs to), then applies ten watch events to
//! scope B (namespace `b`, `app=b`), and every `<compact-every>`th iteration compacts (1 makes
//! kills likely to land mid-compaction). After each relist returns
//! (and so is flushed) it prints `replaced <rv>`, and in `sync` mode `applied <rv>` after each
//! event: the test checks that nothing acknowledged is lost. It resumes numbering from what the store holds, so it can be killed and rerun.

use std::io::Write;

use outpost_cache::{EventType, Gvr, Scope, SledOptions, SledStore, Store};
use outpost_core::selector::{FieldSelector, LabelSelector};
use serde_json::{Value, json};

const POD_LIST: &str = include_str!("../../../testkit/fixtures/kube-system-pods.json");

fn scope_a() -> Scope {
    Scope::unfiltered("kubelet", &Gvr::new("", "v1", "pods"), Some("a"))
}

fn scope_b() -> Scope {
    let labels = LabelSelector::parse("app=b").expect("valid selector");
    Scope::new(
        "kubelet",
        &Gvr::new("", "v1", "pods"),
        Some("b"),
        labels,
        FieldSelector::default(),
    )
}

/// A real pod renamed and versioned; `list_rv` marks which relist it belongs to.
fn pod(template: &Value, ns: &str, name: &str, rv: u64, list_rv: Option<u64>) -> Vec<u8> {
    let mut p = template.clone();
    let meta = &mut p["metadata"];
    meta["name"] = json!(name);
    meta["namespace"] = json!(ns);
    meta["uid"] = json!(format!("uid-{ns}-{name}-{rv}"));
    meta["resourceVersion"] = json!(rv.to_string());
    meta["labels"]["app"] = json!(ns);
    if let Some(list_rv) = list_rv {
        meta["annotations"] = json!({"outpost.test/list-rv": list_rv.to_string()});
    }
    serde_json::to_vec(&p).expect("serializes")
}

/// xorshift64: enough randomness to vary the event mix, no dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cache-writer <cache-dir> <compact-every> sync|batched";
    let dir = args.next().expect(usage);
    let compact_every: u64 = args.next().and_then(|n| n.parse().ok()).expect(usage);
    let sync = match args.next().as_deref() {
        Some("sync") => true,
        Some("batched") => false,
        _ => panic!("{usage}"),
    };
    let options = SledOptions {
        max_events_per_scope: 64,
        sync_every_write: sync,
        ..SledOptions::default()
    };
    let store = SledStore::open(&dir, options).expect("open cache");
    let list: Value = serde_json::from_str(POD_LIST).expect("fixture is JSON");
    let template = list["items"][6].clone();
    let (a, b) = (scope_a(), scope_b());
    let known = |s: &Scope| {
        store
            .scope_resource_version(s)
            .expect("read")
            .and_then(|r| r.number())
    };
    let mut rv = known(&a).max(known(&b)).unwrap_or(0) + 1;
    if known(&b).is_none() {
        store
            .replace_scope(&b, &rv.to_string(), &[])
            .expect("create scope b");
    }
    let mut rng = rv | 1;
    let mut stdout = std::io::stdout();
    for iteration in 0u64.. {
        let count = 20 + rv % 17;
        let list_rv = rv + count;
        let items: Vec<Vec<u8>> = (0..count)
            .map(|i| pod(&template, "a", &format!("a-{i}"), rv + i, Some(list_rv)))
            .collect();
        let refs: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
        store
            .replace_scope(&a, &list_rv.to_string(), &refs)
            .expect("replace");
        writeln!(stdout, "replaced {list_rv}")
            .and_then(|()| stdout.flush())
            .expect("stdout");
        rv = list_rv + 1;
        for _ in 0..10 {
            let name = format!("b-{}", next(&mut rng) % 10);
            let event_type = match next(&mut rng) % 5 {
                0 => EventType::Deleted,
                1 => EventType::Added,
                _ => EventType::Modified,
            };
            store
                .apply_event(&b, event_type, &pod(&template, "b", &name, rv, None))
                .expect("event");
            if sync {
                writeln!(stdout, "applied {rv}")
                    .and_then(|()| stdout.flush())
                    .expect("stdout");
            }
            rv += 1;
        }
        if iteration % compact_every == compact_every - 1 {
            store.compact().expect("compact");
            writeln!(stdout, "compacted")
                .and_then(|()| stdout.flush())
                .expect("stdout");
        }
    }
}
