pub mod edge;

pub mod procs;
