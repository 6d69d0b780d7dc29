//! How a trial is made, under three protocols (docs/reference.md §7–§10) over one pipeline.
//! `pipeline`: which rows are scored (prefill or decode), the head's target, one trial of a
//! method and its measurement, the row; `trial`: the flags and mass a measurement reads.
//! `layer_hook`: a method as every layer's attention of a model, each layer's head measured by
//! the same pipeline. `end_to_end`: the protocol of §10, a method in every layer and the damage
//! at the output. The sweep, `score`, `bench` and the end-to-end face schedule; none of them
//! builds a trial its own way.

pub mod end_to_end;
pub mod layer_hook;
pub mod pipeline;
pub mod trial;

pub use pipeline::{HeadTarget, Measured, Protocol, RowAt};
