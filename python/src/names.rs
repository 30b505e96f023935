//! The stable names of the core's option enums, as Python's string arguments spell them: the
//! core's own table ([`care_core::Named`]), so Python accepts exactly what every other surface
//! accepts.

pub use care_core::Named;
use pyo3::PyResult;

use crate::error::invalid;

/// Parses `value` as a name of `T`, naming the argument and the accepted names on failure.
pub fn parse<T: Named>(arg: &str, value: &str) -> PyResult<T> {
    T::from_name(value).ok_or_else(|| {
        invalid(format!(
            "{arg}={value:?}: unknown {} (expected one of {})",
            T::KIND,
            T::NAMES.join(", ")
        ))
    })
}
