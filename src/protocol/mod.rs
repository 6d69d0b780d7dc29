//! How a trial is made. `trial`: one trial's measurement, which every protocol shares (the
//! sweep's prefill and decode trials, §7–§9, and the end-to-end run's layers). `layer_hook`: a
//! method as every layer's attention of a model. `end_to_end`: the protocol of docs/reference.md §10, a
//! method in every layer and the damage at the output.

pub mod end_to_end;
pub mod layer_hook;
pub mod trial;
