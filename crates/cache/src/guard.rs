//! Panics inside sled become [`CacheError::Damaged`]: sled 0.34 panics on some damaged files
//! (an index out of bounds while it reads a truncated segment, an `expect` on a torn record)
//! where it should report corruption, at open and on later reads alike. The proxy must never go
//! down because of its cache, so every call into sled runs under [`catching`].
//!
//! The panic hook is wrapped once per process: a panic on a thread inside [`catching`] is kept
//! for the error (one `warn!` line where the store handles it) instead of the default hook's
//! report with its backtrace; panics anywhere else go to the previous hook unchanged. sled's own
//! background threads are not covered: a panic there ends that thread, and the calls that wait
//! for it fail or stall, which the store reports as an error or as a call without progress
//! (`Health::busy_for`).

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use crate::error::CacheError;

thread_local! {
    /// Set while this thread runs inside [`catching`].
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// What the hook saw of the last caught panic on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Runs `call`, turning a panic into [`CacheError::Damaged`]. A store whose sled panicked is not
/// trusted again: its caller treats the error as damage (see `CacheError::is_damage`).
pub(crate) fn catching<T>(call: impl FnOnce() -> T) -> Result<T, CacheError> {
    install_hook();
    let outer = CATCHING.replace(true);
    let result = panic::catch_unwind(AssertUnwindSafe(call));
    CATCHING.set(outer);
    result.map_err(|payload| {
        let seen = CAUGHT.take();
        let message = seen.unwrap_or_else(|| payload_text(payload.as_ref()));
        CacheError::Damaged(format!("sled panicked: {message}"))
    })
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CATCHING.get() {
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let text = payload_text(info.payload());
                CAUGHT.set(Some(format!("{text}{at}")));
            } else {
                previous(info);
            }
        }));
    });
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_damage_error_naming_where_it_happened() {
        let err = catching(|| -> u8 { panic!("index out of bounds: the len is 3") }).unwrap_err();
        assert!(err.is_damage(), "{err}");
        let text = err.to_string();
        assert!(text.contains("index out of bounds"), "{text}");
        assert!(text.contains("guard.rs"), "{text}");
        assert_eq!(catching(|| 7).unwrap(), 7);
        // Nested: the inner call's panic is the inner call's error only.
        let outer = catching(|| catching(|| -> u8 { panic!("inner") }).is_err()).unwrap();
        assert!(outer);
    }
}
