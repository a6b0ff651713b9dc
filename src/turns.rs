//! One operation out at a time, each serving every caller that joined it
//! before it began (`Turns`). A caller never joins an operation already
//! out (its answer may predate the caller): it joins the next, which begins
//! once the one out has ended. With nothing out the next begins at once, so
//! one caller alone waits for nothing more than its own operation; callers
//! arriving while one is out share one instead of queueing one each. Used
//! by the searches' freshness reads and the writers' fences.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

pub struct Turns<T> {
    state: Mutex<State<T>>,
    /// Signalled when an operation ends (the next may begin).
    idle: Notify,
}

struct State<T> {
    /// An operation is out.
    out: bool,
    /// What the next operation serves: filled by the callers that joined it.
    next: Option<T>,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Turns {
            state: Mutex::new(State { out: false, next: None }),
            idle: Notify::new(),
        }
    }
}

impl<T> Turns<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the next operation: `f` gets it under the lock. When it finds
    /// none (`None`), the caller fills it and must then run `take` on a task
    /// of its own (so that a caller that goes away takes no one else's
    /// answer with it).
    pub fn join<R>(&self, f: impl FnOnce(&mut Option<T>) -> R) -> R {
        f(&mut self.lock().next)
    }

    /// Waits until no operation is out, then takes the next one to run (None:
    /// another task took it). It is out until the returned guard drops, also
    /// when the task running it is cancelled; whoever joins from now on
    /// joins a later one.
    pub async fn take(&self) -> Option<(T, Out<'_, T>)> {
        loop {
            let ended = self.idle.notified();
            {
                let mut st = self.lock();
                if !st.out {
                    let next = st.next.take()?;
                    st.out = true;
                    return Some((next, Out(self)));
                }
            }
            ended.await;
        }
    }
}

/// An operation out: when it drops, the next may begin.
pub struct Out<'a, T>(&'a Turns<T>);

impl<T> Drop for Out<'_, T> {
    fn drop(&mut self) {
        self.0.lock().out = false;
        self.0.idle.notify_waiters();
    }
}
