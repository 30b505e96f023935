//! Errors as exceptions: every failure raises `care_rl.CareError` (a `ValueError`) carrying the
//! stable code and number of `care_core::Error` (SPEC §14), so a caller can branch on
//! `e.code == "missing_score"` exactly as on the CLI's `{"error":{"code"}}` or the C result.

use care_core::Error;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    care_rl,
    CareError,
    PyValueError,
    "A care operation failed. `code` is the stable snake_case code (`\"missing_score\"`), \
     `number` the stable number (the C `care_result`, grouped by hundreds), `message` the text."
);

/// The exception for `e`, with `what` (the operation or argument) in front of the message.
pub fn core_err(what: &str, e: Error) -> PyErr {
    make(what, e.message(), e.code(), e.number())
}

/// The exception for `e` followed by one indented line per item of `lines`:
/// `"rubric breaks the format contract (format_violation):\n  weight_sum: ..."`.
pub fn core_err_lines(e: Error, lines: &[String]) -> PyErr {
    let mut head = format!("{} ({})", e.message(), e.code());
    if !lines.is_empty() {
        head.push(':');
        for l in lines {
            head.push_str("\n  ");
            head.push_str(l.trim_end());
        }
    }
    finish(head, e.code(), e.number())
}

/// A bad argument of the bindings themselves (wrong dtype, device, shape): `invalid_argument`.
pub fn invalid(msg: String) -> PyErr {
    let e = Error::InvalidArgument;
    make(&msg, "", e.code(), e.number())
}

/// Arguments whose lengths do not fit together: `length_mismatch`.
pub fn mismatch(msg: String) -> PyErr {
    let e = Error::LengthMismatch;
    make(&msg, "", e.code(), e.number())
}

/// An error with a code that only the bindings (and the C ABI) have, such as
/// `invalid_profile`.
pub fn make_code(what: &str, code: &'static str, number: u32) -> PyErr {
    make(what, "", code, number)
}

fn make(what: &str, message: &str, code: &'static str, number: u32) -> PyErr {
    let text = if message.is_empty() {
        format!("{what} ({code})")
    } else {
        format!("{what}: {message} ({code})")
    };
    finish(text, code, number)
}

/// The `CareError` with its full text, `code` and `number`.
fn finish(text: String, code: &'static str, number: u32) -> PyErr {
    Python::attach(|py| {
        let err = CareError::new_err(text.clone());
        let v = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail short of memory
        // exhaustion; the error itself is what the caller needs, so such a failure is dropped.
        let _ = v.setattr("code", code);
        let _ = v.setattr("number", number);
        let _ = v.setattr("message", text);
        err
    })
}

/// `Result<T, Error>` to `PyResult<T>`, naming the operation.
pub trait OrRaise<T> {
    /// Converts the error with [`core_err`].
    fn or_raise(self, what: &str) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, Error> {
    fn or_raise(self, what: &str) -> PyResult<T> {
        self.map_err(|e| core_err(what, e))
    }
}

/// `_care.error(code, what) -> CareError`: the exception for a stable code, for the Python
/// layer's own argument checks (so they carry `code` and `number` like every other error).
#[pyfunction]
pub fn error(py: Python<'_>, code: &str, what: &str) -> PyResult<Py<PyAny>> {
    let e = Error::ALL
        .iter()
        .find(|e| e.code() == code)
        .ok_or_else(|| PyValueError::new_err(format!("unknown care error code {code:?}")))?;
    Ok(make(what, "", e.code(), e.number())
        .value(py)
        .clone()
        .into_any()
        .unbind())
}
