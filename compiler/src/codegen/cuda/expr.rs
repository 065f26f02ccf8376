//! The [`crate::ops`] primitives as CUDA C: each primitive becomes one `const` statement, so a
//! unary or binary op is emitted from its one formula, and its last statement defines the
//! expression node's variable. The NaN-propagating `kiln_max` /
//! `kiln_min` live in `kernels/cuda/prelude.cuh` (CUDA's `fmaxf`/`fminf` drop NaN).

use std::fmt::Write;

use super::emit::f32_lit;
use crate::ops::Prims;

/// Collects statements `const T {base}N = ...;`; values are indices into `names`.
pub(crate) struct CudaPrims {
    base: String,
    names: Vec<String>,
    /// (type, value index, right-hand side) in order.
    stmts: Vec<(&'static str, usize, String)>,
}

impl CudaPrims {
    pub fn new(base: String) -> Self {
        CudaPrims { base, names: Vec::new(), stmts: Vec::new() }
    }
    /// Writes the statements into `code`, the one that computes `v` (the result) named `name`.
    pub fn finish(mut self, v: usize, name: &str, code: &mut String, indent: &str) {
        match self.stmts.last() {
            Some(&(_, last, _)) if last == v => self.names[v] = name.to_string(),
            _ => self.stmts.push(("float", usize::MAX, self.names[v].to_string())),
        }
        for (ty, i, rhs) in &self.stmts {
            let n = if *i == usize::MAX { name } else { &self.names[*i] };
            let _ = writeln!(code, "{indent}const {ty} {n} = {rhs};");
        }
    }
    /// An existing C expression (a variable) as a value.
    pub fn input(&mut self, name: String) -> usize {
        self.names.push(name);
        self.names.len() - 1
    }
    fn stmt(&mut self, ty: &'static str, rhs: String) -> usize {
        let n = format!("{}{}", self.base, self.names.len());
        let v = self.input(n);
        self.stmts.push((ty, v, rhs));
        v
    }
    fn f(&mut self, rhs: String) -> usize {
        self.stmt("float", rhs)
    }
    fn call(&mut self, fun: &str, args: &[usize]) -> usize {
        let a: Vec<&str> = args.iter().map(|&v| self.names[v].as_str()).collect();
        let rhs = format!("{fun}({})", a.join(", "));
        self.f(rhs)
    }
    fn infix(&mut self, a: usize, op: &str, b: usize) -> usize {
        let rhs = format!("{} {op} {}", self.names[a], self.names[b]);
        self.f(rhs)
    }
}

impl Prims for CudaPrims {
    type V = usize;
    type M = usize;
    fn c(&mut self, v: f64) -> usize {
        self.input(f32_lit(v as f32))
    }
    fn add(&mut self, a: usize, b: usize) -> usize {
        self.infix(a, "+", b)
    }
    fn sub(&mut self, a: usize, b: usize) -> usize {
        self.infix(a, "-", b)
    }
    fn mul(&mut self, a: usize, b: usize) -> usize {
        self.infix(a, "*", b)
    }
    fn div(&mut self, a: usize, b: usize) -> usize {
        self.infix(a, "/", b)
    }
    fn fma(&mut self, a: usize, b: usize, c: usize) -> usize {
        self.call("fmaf", &[a, b, c])
    }
    fn neg(&mut self, a: usize) -> usize {
        let rhs = format!("-{}", self.names[a]);
        self.f(rhs)
    }
    fn sqrt(&mut self, a: usize) -> usize {
        self.call("sqrtf", &[a])
    }
    fn max(&mut self, a: usize, b: usize) -> usize {
        self.call("kiln_max", &[a, b])
    }
    fn min(&mut self, a: usize, b: usize) -> usize {
        self.call("kiln_min", &[a, b])
    }
    fn trunc(&mut self, a: usize) -> usize {
        self.call("truncf", &[a])
    }
    fn exp(&mut self, a: usize) -> usize {
        self.call("expf", &[a])
    }
    fn log(&mut self, a: usize) -> usize {
        self.call("logf", &[a])
    }
    fn erf(&mut self, a: usize) -> usize {
        self.call("erff", &[a])
    }
    fn tanh(&mut self, a: usize) -> usize {
        self.call("tanhf", &[a])
    }
    fn lt(&mut self, a: usize, b: usize) -> usize {
        let rhs = format!("{} < {}", self.names[a], self.names[b]);
        self.stmt("bool", rhs)
    }
    fn ne(&mut self, a: usize, b: usize) -> usize {
        let rhs = format!("{} != {}", self.names[a], self.names[b]);
        self.stmt("bool", rhs)
    }
    fn select(&mut self, m: usize, a: usize, b: usize) -> usize {
        let rhs = format!("{} ? {} : {}", self.names[m], self.names[a], self.names[b]);
        self.f(rhs)
    }
}
