//! Events, published beside the pass rather than in it.
//!
//! A stage that starts on a hundred nodes asks for a hundred events with its hundred Job
//! creates. Events inform; the node patches and Jobs move the rollout. So the pass hands its
//! events to a queue and goes on, and a task publishes them a few at a time, taking the same
//! write tokens as every other request (the `--api-qps` limit covers both). The queue is
//! bounded: when it is full, the pass waits for room instead of dropping an event.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use nodewright_planner::{Event, Target};
use tokio::sync::mpsc;

use crate::world::World;

/// Events waiting to be published before a pass has to wait for room.
const QUEUE: usize = 2048;

/// Events in flight at once.
const PARALLEL: usize = 8;

/// The pass's end of the queue.
#[derive(Clone, Debug)]
pub struct Events {
    queue: mpsc::Sender<Event>,
}

impl Events {
    /// Starts the publishing task: events are recorded as `recorder`'s reporter, each after
    /// a token from `limiter`, counted in `sent`.
    pub fn start(
        recorder: Recorder,
        world: World,
        limiter: Arc<governor::DefaultDirectRateLimiter>,
        sent: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        let publisher = Publisher {
            recorder,
            world,
            limiter,
            sent,
        };
        tokio::spawn(async move {
            let publisher = &publisher;
            stream_of(rx)
                .for_each_concurrent(PARALLEL, |e| async move { publisher.publish(&e).await })
                .await;
        });
        Events { queue }
    }

    /// Queues an event; waits only while the queue is full.
    pub async fn send(&self, e: Event) {
        if self.queue.send(e).await.is_err() {
            tracing::warn!("the event publisher has stopped; an event was not recorded");
        }
    }
}

/// The receiving end as a stream.
fn stream_of(mut rx: mpsc::Receiver<Event>) -> impl futures::Stream<Item = Event> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

struct Publisher {
    recorder: Recorder,
    world: World,
    limiter: Arc<governor::DefaultDirectRateLimiter>,
    sent: prometheus_client::metrics::counter::Counter,
}

impl Publisher {
    async fn publish(&self, e: &Event) {
        let reference = match &e.target {
            // A CR deleted since the pass: nothing to attach the event to.
            Target::Cr(name) => match self.world.nodewright(name) {
                Some(cr) => cr.object_ref(&()),
                None => return,
            },
            Target::Node(name) => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.clone()),
                uid: Some(name.clone()),
                ..Default::default()
            },
        };
        let ev = KubeEvent {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.into(),
            note: Some(e.message.chars().take(1000).collect()),
            // The recorder folds events with the same (reason, action) on an object into one
            // series that keeps the first note; every distinct message is its own event.
            action: format!("{}-{:08x}", e.reason, fnv(&e.message)),
            secondary: None,
        };
        self.limiter.until_ready().await;
        self.sent.inc();
        if let Err(err) = self.recorder.publish(&ev, &reference).await {
            tracing::debug!("event {}: {err}", e.reason);
        }
    }
}

/// FNV-1a, 32 bits: a short stable tag for a message.
fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}
