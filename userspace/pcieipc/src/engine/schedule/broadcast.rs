//! Broadcast: a pipelined chain root → root+1 → … → root−1.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chain {
    pub nranks: usize,
    pub root: usize,
}

impl Chain {
    /// `rank`'s place in the chain: 0 at the root.
    pub fn position(&self, rank: usize) -> usize {
        (rank + self.nranks - self.root) % self.nranks
    }

    /// Whether `rank` passes what it receives on to its successor.
    pub fn forwards(&self, rank: usize) -> bool {
        self.position(rank) + 1 < self.nranks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_starts_at_the_root_and_ends_before_it() {
        let chain = Chain { nranks: 4, root: 2 };
        let table = [(2, 0, true), (3, 1, true), (0, 2, true), (1, 3, false)];
        for (rank, position, forwards) in table {
            assert_eq!(chain.position(rank), position, "rank {rank}");
            assert_eq!(chain.forwards(rank), forwards, "rank {rank}");
        }
        assert!(!Chain { nranks: 1, root: 0 }.forwards(0));
    }
}
