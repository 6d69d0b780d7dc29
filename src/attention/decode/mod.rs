//! Decode-time KV-cache compression (METHODS.md §9, issue 35), being built: the continuation
//! protocol (`--decode N_F`) and the methods (SnapKV, PyramidKV, Ada-KV, H2O, TOVA, Quest at
//! decode, the oracles) come next. What is here is what they share and what can be checked by
//! hand on its own: the layer budgets of PyramidKV and Ada-KV (`budgets`). The pooling of their
//! scores is `numerics::pooling`; the stable top-k is the prefill family's.

pub mod budgets;
