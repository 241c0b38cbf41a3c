//! A runtime-agnostic cancellation token with parent/child links.
//!
//! Written here rather than taken from `tokio-util` because `keel-core` must not depend on
//! an async runtime (tool traits live here and must be implementable without tokio). It is
//! a thin layer over `event-listener`, which does the waker bookkeeping.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use event_listener::Event;

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    event: Event,
    children: Mutex<Vec<Weak<Inner>>>,
}

impl Inner {
    fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        self.event.notify(usize::MAX);
        let children = match self.children.lock() {
            Ok(mut guard) => std::mem::take(&mut *guard),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        for child in children.iter().filter_map(Weak::upgrade) {
            child.cancel();
        }
    }
}

/// Signals cancellation to everything holding a clone or a child of this token.
///
/// Cancelling a token cancels all its children; cancelling a child leaves the parent alone.
///
/// ```
/// use keel_core::CancellationToken;
///
/// let run = CancellationToken::new();
/// let call = run.child();
/// call.child().cancel(); // a grandchild: neither the call nor the run
/// assert!(!call.is_cancelled());
/// run.cancel();
/// assert!(call.is_cancelled());
/// futures::executor::block_on(call.cancelled()); // already cancelled: returns at once
/// ```
#[derive(Debug, Clone, Default)]
pub struct CancellationToken {
    inner: Arc<Inner>,
}

impl CancellationToken {
    /// A new, uncancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that is cancelled when this one is (or when itself is cancelled).
    pub fn child(&self) -> Self {
        let child = Self::new();
        if self.is_cancelled() {
            child.cancel();
            return child;
        }
        let mut children = match self.inner.children.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        children.retain(|weak| weak.strong_count() > 0);
        children.push(Arc::downgrade(&child.inner));
        drop(children);
        // The parent may have been cancelled between the check and the push.
        if self.is_cancelled() {
            child.cancel();
        }
        child
    }

    /// Cancels this token and its children. Idempotent.
    pub fn cancel(&self) {
        self.inner.cancel();
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Completes once the token is cancelled.
    pub async fn cancelled(&self) {
        loop {
            if self.is_cancelled() {
                return;
            }
            let listener = self.inner.event.listen();
            if self.is_cancelled() {
                return;
            }
            listener.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelling_parent_cancels_children_not_reverse() {
        let parent = CancellationToken::new();
        let child = parent.child();
        let grandchild = child.child();
        grandchild.cancel();
        assert!(!child.is_cancelled());
        parent.cancel();
        assert!(child.is_cancelled());
        futures::executor::block_on(child.cancelled());
    }

    #[test]
    fn child_of_cancelled_parent_is_cancelled() {
        let parent = CancellationToken::new();
        parent.cancel();
        assert!(parent.child().is_cancelled());
    }
}
