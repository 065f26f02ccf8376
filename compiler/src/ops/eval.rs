//! [`Prims`] on host floats: [`F64`] for the reference interpreter (the oracle), [`F32`] for the
//! kernel-level evaluator. One generic implementation over [`Float`], so both follow the
//! special-value contract of [`super`] in the same code.

use super::Prims;

/// What the evaluators need of a host float type.
pub trait Float: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self> + std::ops::Div<Output = Self> + std::ops::Neg<Output = Self>
{
    const NAN: Self;
    fn from_f64(v: f64) -> Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn sqrt(self) -> Self;
    fn trunc(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn erf(self) -> Self;
    fn tanh(self) -> Self;
    fn is_nan(self) -> bool;
    /// Bitwise and / or of the two (used for the sign of `max`/`min` of ±0).
    fn and_bits(self, b: Self) -> Self;
    fn or_bits(self, b: Self) -> Self;
}

macro_rules! float {
    ($t:ty, $erf:path) => {
        impl Float for $t {
            const NAN: Self = <$t>::NAN;
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn trunc(self) -> Self {
                <$t>::trunc(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn and_bits(self, b: Self) -> Self {
                <$t>::from_bits(self.to_bits() & b.to_bits())
            }
            fn or_bits(self, b: Self) -> Self {
                <$t>::from_bits(self.to_bits() | b.to_bits())
            }
        }
    };
}
float!(f32, libm::erff);
float!(f64, libm::erf);

/// Host evaluation in the float type `T`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Host<T>(std::marker::PhantomData<T>);
/// The oracle's precision.
pub type F64 = Host<f64>;
/// The planned kernels' precision.
pub type F32 = Host<f32>;

impl<T: Float> Host<T> {
    pub fn new() -> Self {
        Host(std::marker::PhantomData)
    }
}

impl<T: Float> Prims for Host<T> {
    type V = T;
    type M = bool;
    fn c(&mut self, v: f64) -> T {
        T::from_f64(v)
    }
    fn add(&mut self, a: T, b: T) -> T {
        a + b
    }
    fn sub(&mut self, a: T, b: T) -> T {
        a - b
    }
    fn mul(&mut self, a: T, b: T) -> T {
        a * b
    }
    fn div(&mut self, a: T, b: T) -> T {
        a / b
    }
    fn fma(&mut self, a: T, b: T, c: T) -> T {
        a.mul_add(b, c)
    }
    fn neg(&mut self, a: T) -> T {
        -a
    }
    fn sqrt(&mut self, a: T) -> T {
        a.sqrt()
    }
    fn max(&mut self, a: T, b: T) -> T {
        if a.is_nan() || b.is_nan() {
            T::NAN
        } else if a == b {
            a.and_bits(b) // +0 if either is +0
        } else if a > b {
            a
        } else {
            b
        }
    }
    fn min(&mut self, a: T, b: T) -> T {
        if a.is_nan() || b.is_nan() {
            T::NAN
        } else if a == b {
            a.or_bits(b) // -0 if either is -0
        } else if a < b {
            a
        } else {
            b
        }
    }
    fn trunc(&mut self, a: T) -> T {
        a.trunc()
    }
    fn exp(&mut self, a: T) -> T {
        a.exp()
    }
    fn log(&mut self, a: T) -> T {
        a.ln()
    }
    fn erf(&mut self, a: T) -> T {
        a.erf()
    }
    fn tanh(&mut self, a: T) -> T {
        a.tanh()
    }
    fn lt(&mut self, a: T, b: T) -> bool {
        a < b
    }
    fn ne(&mut self, a: T, b: T) -> bool {
        a != b
    }
    fn select(&mut self, m: bool, a: T, b: T) -> T {
        if m {
            a
        } else {
            b
        }
    }
}

/// `op(x)` in `T`.
pub fn unary<T: Float>(op: kiln_runtime::graph::UnaryOp, x: T) -> T {
    super::unary::apply(&mut Host::<T>::new(), op, x)
}

/// `a op b` in `T` (`int`: integer operands, see [`super::binary::apply`]).
pub fn binary<T: Float>(op: kiln_runtime::graph::BinaryOp, int: bool, a: T, b: T) -> T {
    super::binary::apply(&mut Host::<T>::new(), op, int, a, b)
}
