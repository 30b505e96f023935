//! `care-core`: the `no_std` reward core of `care`.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod error;
pub mod grpo;
pub use error::{Error, Result};
