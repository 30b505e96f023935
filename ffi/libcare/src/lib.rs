//! `libcare.so` / `libcare.a`: every `#[no_mangle]` entry point of `care_ffi`, linked into the
//! C artifacts. The header is `include/care.h`; the code and its docs are in `care_ffi`.

// Linking the crate is what exports its symbols; nothing needs to be named here.
extern crate care_ffi;
