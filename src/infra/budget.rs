//! A byte budget for a queue: what bounds the outgoing queue of a client, the input queue of an
//! agent and the transcript writer's queue in bytes, next to the channel that bounds them in
//! messages.
//!
//! A sender takes the length of what it queues ([`ByteBudget::try_take`] never waits,
//! [`ByteBudget::take`] waits for room); the side that drains the queue gives it back once the
//! item is written ([`ByteBudget::give_back`]), so the budget covers an item from the moment it
//! is queued until it has left the process. An item larger than the whole budget takes all of it:
//! it still passes, alone. What must be queued whatever the room ([`ByteBudget::take_anyway`])
//! goes into debt, paid back first.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

/// Bytes that may be queued at once. Cheap to clone; clones share the budget.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    room: Arc<Semaphore>,
    /// Taken beyond the room ([`ByteBudget::take_anyway`]), not yet given back.
    debt: Arc<AtomicUsize>,
    max: usize,
}

impl ByteBudget {
    /// A budget of `max` bytes (at least 1).
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            room: Arc::new(Semaphore::new(max)),
            debt: Arc::new(AtomicUsize::new(0)),
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

    /// Takes what items of `lens` bytes hold, waiting once for room for all of them; `false`
    /// (nothing taken) when together they hold more than the whole budget (take each then).
    pub async fn take_all(&self, lens: impl IntoIterator<Item = usize>) -> bool {
        let total: usize = lens.into_iter().map(|len| self.cost(len) as usize).sum();
        let Ok(total) = u32::try_from(total) else { return false };
        if total as usize > self.max {
            return false;
        }
        // The semaphore is never closed.
        if let Ok(permit) = self.room.acquire_many(total).await {
            permit.forget();
        }
        true
    }

    /// Takes `len` bytes now, from the room if there is some, else as debt (paid back first
    /// when bytes are given back). Returns the debt now.
    pub fn take_anyway(&self, len: usize) -> usize {
        if self.try_take(len) {
            return self.debt.load(Ordering::Acquire);
        }
        let cost = self.cost(len) as usize;
        self.debt.fetch_add(cost, Ordering::AcqRel) + cost
    }

    /// Gives back what items of `lens` bytes took: the debt first, then the room.
    pub fn give_back(&self, lens: impl IntoIterator<Item = usize>) {
        let mut n: usize = lens.into_iter().map(|len| self.cost(len) as usize).sum();
        let mut debt = self.debt.load(Ordering::Acquire);
        while debt > 0 && n > 0 {
            let pay = debt.min(n);
            match self
                .debt
                .compare_exchange(debt, debt - pay, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    n -= pay;
                    break;
                }
                Err(now) => debt = now,
            }
        }
        if n > 0 {
            self.room.add_permits(n);
        }
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

    #[tokio::test]
    async fn items_taken_together_are_given_back_one_by_one_and_more_than_the_budget_is_refused() {
        let budget = ByteBudget::new(100);
        assert!(budget.take_all([30, 0, 20]).await, "an empty item holds a byte");
        assert_eq!(budget.available(), 49);
        budget.give_back([30, 0, 20]);
        assert_eq!(budget.available(), 100);
        assert!(!budget.take_all([60, 60]).await, "together over the whole budget");
        assert_eq!(budget.available(), 100, "nothing taken");
        assert!(budget.try_take(80));
        let waiting = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.take_all([10, 20]).await })
        };
        budget.give_back([80]);
        let taken = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("room came back")
            .expect("join");
        assert!(taken);
        assert_eq!(budget.available(), 70);
    }

    #[test]
    fn what_is_taken_anyway_is_debt_paid_back_first() {
        let budget = ByteBudget::new(100);
        assert!(budget.try_take(100));
        assert_eq!(budget.take_anyway(30), 30, "no room: debt");
        assert_eq!(budget.take_anyway(20), 50);
        budget.give_back([40]);
        assert_eq!(budget.available(), 0, "the debt is paid first");
        budget.give_back([10]);
        assert_eq!(budget.available(), 0);
        budget.give_back([100]);
        assert_eq!(budget.available(), 100);
        assert_eq!(budget.take_anyway(10), 0, "room again: no debt");
    }
}
