//! A byte budget for a queue: what bounds the outgoing queue of a client, the input queue of an
//! agent and the transcript writer's queue in bytes, next to the channel that bounds them in
//! messages.
//!
//! A sender takes the length of what it queues ([`ByteBudget::try_take`] never waits,
//! [`ByteBudget::take`] waits for room); the side that drains the queue gives it back once the
//! item is written ([`ByteBudget::give_back`]), so the budget covers an item from the moment it
//! is queued until it has left the process. An item larger than the whole budget takes all of it:
//! it still passes, alone.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Bytes that may be queued at once. Cheap to clone; clones share the budget.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    room: Arc<Semaphore>,
    max: usize,
}

impl ByteBudget {
    /// A budget of `max` bytes (at least 1).
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            room: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// What an item of `len` bytes holds of the budget.
    fn cost(&self, len: usize) -> u32 {
        u32::try_from(len.clamp(1, self.max)).unwrap_or(u32::MAX)
    }

    /// Takes `len` bytes if there is room now.
    pub fn try_take(&self, len: usize) -> bool {
        match self.room.try_acquire_many(self.cost(len)) {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `len` bytes, waiting for room.
    pub async fn take(&self, len: usize) {
        // The semaphore is never closed.
        if let Ok(permit) = self.room.acquire_many(self.cost(len)).await {
            permit.forget();
        }
    }

    /// Gives back what items of `lens` bytes took.
    pub fn give_back(&self, lens: impl IntoIterator<Item = usize>) {
        let n: usize = lens.into_iter().map(|len| self.cost(len) as usize).sum();
        self.room.add_permits(n);
    }

    /// Bytes free now.
    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.room.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_are_held_until_given_back_and_a_huge_item_takes_everything() {
        let budget = ByteBudget::new(100);
        assert!(budget.try_take(60));
        assert!(!budget.try_take(60), "over the budget");
        assert!(budget.try_take(40));
        budget.give_back([60, 40]);
        assert_eq!(budget.available(), 100);
        assert!(budget.try_take(10_000), "an item larger than the budget passes alone");
        assert!(!budget.try_take(1));
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.take(5).await })
        };
        budget.give_back([10_000]);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("room came back")
            .expect("join");
        assert_eq!(budget.available(), 95);
    }
}
