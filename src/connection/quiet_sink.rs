//! A sink that wakes its task only while it waits on the sink.
//!
//! The WebSocket library (tokio-tungstenite, under axum's `WebSocket`) keeps the last waker
//! each half registered and, when the socket becomes readable, wakes both: a read may have to
//! write (a pong, a close reply). So every frame a client sent woke the connection's writer
//! task too, although it was waiting on its queue, not on the socket. Two tasks woken at once
//! make tokio hand one of them to the other worker: on a round trip, the reader ran on a second
//! thread woken by a futex, which costs tens of microseconds on a virtual machine (strace showed
//! the hop on every prompt). Here the sink is polled with a waker of its own that passes a wake
//! on only while a poll of the sink is pending; a wake after the sink was ready is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::Sink;
use futures_util::task::AtomicWaker;

/// `inner`, woken only while one of its polls is pending.
pub struct QuietSink<S> {
    inner: S,
    gate: Arc<Gate>,
    waker: Waker,
}

/// Passes a wake on to the task that last polled, once, and only while armed.
#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.armed.swap(false, Ordering::AcqRel) {
            self.task.wake();
        }
    }
}

impl<S> QuietSink<S> {
    pub fn new(inner: S) -> Self {
        let gate = Arc::new(Gate::default());
        let waker = Waker::from(gate.clone());
        Self { inner, gate, waker }
    }

    /// Runs one poll of the sink with the gate's waker, armed for the poll and left armed only
    /// when it is pending (a wake during the poll is passed on, so none is lost).
    fn gated<R>(&mut self, cx: &mut Context<'_>, poll: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<R>) -> Poll<R>
    where
        S: Unpin,
    {
        self.gate.task.register(cx.waker());
        self.gate.armed.store(true, Ordering::Release);
        let result = poll(Pin::new(&mut self.inner), &mut Context::from_waker(&self.waker));
        if result.is_ready() {
            self.gate.armed.store(false, Ordering::Release);
        }
        result
    }
}

impl<S: Sink<Item> + Unpin, Item> Sink<Item> for QuietSink<S> {
    type Error = S::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().gated(cx, |s, cx| s.poll_ready(cx))
    }

    fn start_send(self: Pin<&mut Self>, item: Item) -> Result<(), Self::Error> {
        Pin::new(&mut self.get_mut().inner).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().gated(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut().gated(cx, |s, cx| s.poll_close(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A sink that keeps the waker of its last poll and is ready only when told.
    #[derive(Default)]
    struct Held {
        ready: bool,
        waker: Option<Waker>,
    }

    impl Sink<u8> for Held {
        type Error = ();
        fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
            self.waker = Some(cx.waker().clone());
            if self.ready { Poll::Ready(Ok(())) } else { Poll::Pending }
        }
        fn start_send(self: Pin<&mut Self>, _: u8) -> Result<(), ()> {
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
            self.poll_ready(cx)
        }
        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
            self.poll_ready(cx)
        }
    }

    /// Counts the wakes of the task.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_reaches_the_task_only_while_it_waits_on_the_sink() {
        let count = Arc::new(Count::default());
        let task = Waker::from(count.clone());
        let mut cx = Context::from_waker(&task);
        let mut sink = QuietSink::new(Held::default());
        let woken = || count.0.load(Ordering::SeqCst);

        // Pending: the sink's wake is passed on, once.
        assert!(Pin::new(&mut sink).poll_ready(&mut cx).is_pending());
        let inner = sink.inner.waker.clone().expect("the sink kept a waker");
        inner.wake_by_ref();
        inner.wake_by_ref();
        assert_eq!(woken(), 1, "a pending poll's wake reaches the task once");

        // Ready: a later wake of the waker the sink kept (the library's other half reading)
        // does not reach the task.
        sink.inner.ready = true;
        assert!(Pin::new(&mut sink).poll_flush(&mut cx).is_ready());
        sink.inner.waker.clone().expect("kept").wake();
        assert_eq!(woken(), 1, "a wake after the sink was ready is dropped");

        // Pending again: armed again.
        sink.inner.ready = false;
        assert!(Pin::new(&mut sink).poll_close(&mut cx).is_pending());
        sink.inner.waker.clone().expect("kept").wake();
        assert_eq!(woken(), 2);
    }
}
