#![no_std]
// This file exists so waitroom-edge can name this crate as a build-dependency
// (cargo ignores dependencies without a library target); the program is src/main.rs.
