//! Inputs: hub, corpus, model, Q/K/V.
