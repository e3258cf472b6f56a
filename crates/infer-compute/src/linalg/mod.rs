//! f64 dense linear algebra for weight-editing callers (Cholesky, solves,
//! inverse, ridge solve), built on faer.
