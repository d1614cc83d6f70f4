//! The ring planner: a cost model over GPU pairs and the ring that maximises
//! the bottleneck bandwidth (exact up to 16 GPUs), next to NCCL's default.

pub mod cost;
pub mod ring;

pub use cost::{pair_cost, pair_matrix, CostModel, PairMatrix};
pub use ring::{
    best_ring, bus_id_order_ring, exact_ring, heuristic_ring, Ring, RingMethod, EXACT_LIMIT,
};
