//! Frontends: models kiln did not build itself, imported into its graph IR. (kiln's own BERT
//! builder is `models::bert`.)

pub mod onnx;
