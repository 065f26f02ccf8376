//! Weights for CPU plans: the layouts generated code expects ([`WeightSlot`]) and their
//! one-time preparation from checkpoint tensors (conversion, transposition, GEMM packing).
//!
//! [`CpuWeights`] holds the checkpoint tensors once and a cache of prepared slots, so a slot
//! shared by several buckets' plans (every linear layer's packed weight) is prepared once, at
//! the first upload or lowering that needs it, and never per run.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use crate::dtype::{HostTensor, TensorData};
use crate::error::{Error, Result};
use kiln_format::plan::cpu::{WeightPrep, WeightSlot};


/// Prepared weight bytes: zeroed memory as a plan's arena has it (page-aligned, the same
/// huge-page hint).
struct Aligned(crate::cpu::Arena);

impl Aligned {
    fn zeroed(len: usize) -> Result<Self> {
        crate::cpu::Arena::zeroed(len, "prepared weights").map(Aligned)
    }
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }
    fn as_mut_f32(&mut self) -> &mut [f32] {
        let len = self.0.len() / 4;
        // SAFETY: the memory is page-aligned, more than f32 needs, and holds len·4 initialized
        // (zeroed) bytes; every bit pattern is a valid f32.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<f32>(), len) }
    }
    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
}

/// One prepared slot.
enum Prepared {
    /// The checkpoint tensor's own data (layout and dtype already right).
    Host(usize),
    Owned(Aligned),
}

fn host_ptr(t: &HostTensor) -> *const u8 {
    match &t.data {
        TensorData::F32(v) => v.as_ptr().cast(),
        TensorData::F16(v) => v.as_ptr().cast(),
        TensorData::BF16(v) => v.as_ptr().cast(),
        TensorData::I64(v) => v.as_ptr().cast(),
        TensorData::I32(v) => v.as_ptr().cast(),
    }
}

/// A tensor's values as f32: borrowed where it holds f32, converted otherwise.
fn f32_values(t: &HostTensor) -> Cow<'_, [f32]> {
    t.as_f32().map_or_else(|| Cow::Owned(t.to_f32_vec()), Cow::Borrowed)
}

/// The storage a packed-B view indexes: the checkpoint tensor, or (`transposed`) its
/// transpose, row-major `[c, r]` of the slot's `[r, c]`.
fn view_storage<'a>(ckpt: &'a [f32], slot: &WeightSlot, transposed: bool) -> Cow<'a, [f32]> {
    if transposed {
        Cow::Owned(transpose(ckpt, slot.shape[0], slot.shape[1]))
    } else {
        Cow::Borrowed(ckpt)
    }
}

/// Transposes a row-major `[r, c]` matrix.
fn transpose<T: Copy + Default>(v: &[T], r: usize, c: usize) -> Vec<T> {
    let mut t = vec![T::default(); v.len()];
    for i in 0..r {
        for j in 0..c {
            t[j * r + i] = v[i * c + j];
        }
    }
    t
}

struct Inner {
    tensors: Vec<HostTensor>,
    cache: Mutex<Vec<(WeightSlot, Arc<Prepared>)>>,
}

/// Checkpoint tensors plus every slot prepared from them so far. Cheap to clone (shared).
#[derive(Clone)]
pub struct CpuWeights {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CpuWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuWeights").field("tensors", &self.inner.tensors.len()).field("bytes", &self.bytes()).finish()
    }
}

/// Prepared weights of one plan: keeps the slots alive and gives the pointer array.
pub struct SlotPointers {
    _keep: Vec<Arc<Prepared>>,
    _weights: CpuWeights,
    pub ptrs: Vec<*const u8>,
}

// SAFETY: the pointers point into data owned by `_keep` / `_weights` (immutable after
// preparation), which are themselves Send + Sync.
unsafe impl Send for SlotPointers {}
// SAFETY: as above.
unsafe impl Sync for SlotPointers {}
// SAFETY: Prepared holds plain owned bytes.
unsafe impl Send for Prepared {}
// SAFETY: as above; never mutated after construction.
unsafe impl Sync for Prepared {}

impl CpuWeights {
    /// Takes the checkpoint tensors (indexed like the graph's weight table).
    pub fn new(tensors: Vec<HostTensor>) -> Self {
        CpuWeights { inner: Arc::new(Inner { tensors, cache: Mutex::new(Vec::new()) }) }
    }

    pub fn tensors(&self) -> &[HostTensor] {
        &self.inner.tensors
    }

    /// Bytes held: checkpoint tensors plus prepared copies.
    pub fn bytes(&self) -> usize {
        let host: usize = self.inner.tensors.iter().map(|t| t.byte_len()).sum();
        let cache = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        let prepared: usize =
            cache.iter().map(|(_, p)| if let Prepared::Owned(a) = &**p { a.0.len() } else { 0 }).sum();
        host + prepared
    }

    /// Number of slots prepared so far (each at most once).
    pub fn prepared_slots(&self) -> usize {
        self.inner.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Prepares (or finds already prepared) every slot and returns the pointer array a plan's
    /// code reads.
    pub fn pointers(&self, slots: &[WeightSlot]) -> Result<SlotPointers> {
        let mut keep = Vec::with_capacity(slots.len());
        let mut ptrs = Vec::with_capacity(slots.len());
        for s in slots {
            let p = self.prepare(s)?;
            ptrs.push(match &*p {
                Prepared::Host(i) => host_ptr(&self.inner.tensors[*i]),
                Prepared::Owned(a) => a.as_ptr(),
            });
            keep.push(p);
        }
        Ok(SlotPointers { _keep: keep, _weights: self.clone(), ptrs })
    }

    /// Prepares one slot once (cached).
    pub fn prepare_slot(&self, slot: &WeightSlot) -> Result<()> {
        self.prepare(slot).map(|_| ())
    }

    fn prepare(&self, slot: &WeightSlot) -> Result<Arc<Prepared>> {
        let mut cache = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(s, _)| s == slot) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.build(slot)?);
        cache.push((slot.clone(), p.clone()));
        Ok(p)
    }

    fn build(&self, slot: &WeightSlot) -> Result<Prepared> {
        let bad = |m: String| Error::Backend(format!("weight slot for tensor #{}: {m}", slot.index));
        slot.verify().map_err(bad)?;
        let tensor = |i: usize| {
            self.inner
                .tensors
                .get(i)
                .ok_or_else(|| bad(format!("the checkpoint has only {} tensors (slot names #{i})", self.inner.tensors.len())))
        };
        let t = tensor(slot.index)?;
        let joined = match &slot.concat {
            None => None,
            Some(c) => {
                let parts = c.entries(slot.index).map(tensor).collect::<Result<Vec<_>>>()?;
                Some(HostTensor::concat_f32(&parts, c.axis).map_err(|e| bad(e.to_string()))?)
            }
        };
        let t = joined.as_ref().unwrap_or(t);
        if t.shape != slot.shape || t.numel() != slot.numel().unwrap_or(usize::MAX) {
            return Err(Error::TensorMismatch {
                path: "<cpu weights>".into(),
                tensor: format!("#{}", slot.index),
                expected: format!("{:?}", slot.shape),
                found: format!("{:?}", t.shape),
            });
        }
        match &slot.prep {
            WeightPrep::AsIs if t.dtype() == slot.dtype && joined.is_none() => Ok(Prepared::Host(slot.index)),
            WeightPrep::AsIs | WeightPrep::Transposed => {
                let data = match slot.prep {
                    WeightPrep::Transposed => TensorData::from_f64(
                        slot.dtype,
                        &transpose(&t.data.to_f64_vec(), slot.shape[0], slot.shape[1]),
                    ),
                    _ => t.data.convert(slot.dtype),
                };
                let bytes = data.to_le_bytes();
                let mut a = Aligned::zeroed(bytes.len())?;
                a.as_mut_bytes().copy_from_slice(&bytes);
                Ok(Prepared::Owned(a))
            }
            WeightPrep::PackedB { transposed, offset, k, n, row_stride, col_stride } => {
                let (k, n, rs, cs, offset) = (*k, *n, *row_stride, *col_stride, *offset);
                let ckpt = f32_values(t);
                let len = kiln_kernels::gemm::packed_b_len(k, n);
                let mut a = Aligned::zeroed(len * 4)?;
                let dst = a.as_mut_f32();
                let r = if k == 0 || n == 0 {
                    Ok(())
                } else if *transposed && offset == 0 && cs == 1 && rs == slot.shape[0] && k <= slot.shape[1] && n <= slot.shape[0] {
                    // Storage = checkpoint [r, c] transposed: B(p, j) = storage[p·r + j] = ckpt[j·c + p].
                    kiln_kernels::gemm::pack_b_into(&ckpt, k, n, slot.shape[1], true, dst)
                } else {
                    let storage = view_storage(&ckpt, slot, *transposed);
                    let src = &storage[offset.min(storage.len())..];
                    if cs == 1 && (k == 1 || rs >= n) {
                        kiln_kernels::gemm::pack_b_into(src, k, n, if k == 1 { n } else { rs }, false, dst)
                    } else if rs == 1 && (n == 1 || cs >= k) {
                        kiln_kernels::gemm::pack_b_into(src, k, n, if n == 1 { k } else { cs }, true, dst)
                    } else {
                        let mut dense = vec![0f32; k * n];
                        for p in 0..k {
                            for j in 0..n {
                                dense[p * n + j] = src[p * rs + j * cs];
                            }
                        }
                        kiln_kernels::gemm::pack_b_into(&dense, k, n, n, false, dst)
                    }
                };
                r.map_err(|e| bad(format!("cannot pack: {e}")))?;
                Ok(Prepared::Owned(a))
            }
            WeightPrep::PackedBI16 { transposed, offset, k, n, row_stride, col_stride, max_abs } => {
                let ckpt = f32_values(t);
                let storage = view_storage(&ckpt, slot, *transposed);
                let src = &storage[(*offset).min(storage.len())..];
                let pack_err = |e: kiln_kernels::KernelError| {
                    // The element's place in the checkpoint tensor (the storage may be its
                    // transpose).
                    let place = |index: usize| {
                        let e = offset + index;
                        if *transposed { e % slot.shape[0] * slot.shape[1] + e / slot.shape[0] } else { e }
                    };
                    match e {
                        kiln_kernels::KernelError::NotInteger { index, .. } => bad(format!(
                            "element {} (row-major) is {}, not an integer in [-32768, 32767]: the plan was compiled for integer weights (a quantized model's)",
                            place(index),
                            src[index]
                        )),
                        kiln_kernels::KernelError::PastBound { index, .. } => bad(format!(
                            "element {} (row-major) is {}, past the bound ±{max_abs} the plan was compiled for (its integer sums stay exact under it)",
                            place(index),
                            src[index]
                        )),
                        e => bad(format!("cannot pack: {e}")),
                    }
                };
                // One pass reads and checks the values; the layout this machine's fastest
                // integer tile reads (the header records it) follows from their range.
                let vals = kiln_kernels::gemm::IntB::read(src, *k, *n, *row_stride, *col_stride, *max_abs).map_err(pack_err)?;
                let layout = vals.layout();
                let mut a = Aligned::zeroed(kiln_kernels::gemm::packed_b_int_bytes(*k, *n, layout))?;
                vals.pack_into(layout, a.as_mut_bytes()).map_err(pack_err)?;
                Ok(Prepared::Owned(a))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i16_slot(max_abs: u32, transposed: bool) -> WeightSlot {
        WeightSlot {
            index: 0,
            concat: None,
            shape: vec![3, 2],
            dtype: crate::DType::F32,
            prep: WeightPrep::PackedBI16 { transposed, offset: 0, k: if transposed { 2 } else { 3 }, n: if transposed { 3 } else { 2 }, row_stride: 2, col_stride: 1, max_abs },
        }
    }

    #[test]
    fn i16_packing_checks_the_values_the_plan_relies_on() {
        let w = |v: Vec<f32>| CpuWeights::new(vec![HostTensor::f32(vec![3, 2], v).unwrap()]);
        // Integers within the bound, either orientation: packed.
        for tr in [false, true] {
            w(vec![1.0, -2.0, 3.0, -4.0, 5.0, 127.0]).prepare_slot(&i16_slot(127, tr)).unwrap();
        }
        // A fraction, or past the bound: one-line errors naming the tensor and the element.
        for tr in [false, true] {
            let e = w(vec![1.0, -2.0, 3.5, -4.0, 5.0, 6.0]).prepare_slot(&i16_slot(127, tr)).unwrap_err().to_string();
            assert!(e.contains("tensor #0") && e.contains("element 2 (row-major) is 3.5") && !e.contains('\n'), "{e}");
        }
        let e = w(vec![1.0, -2.0, 3.0, -400.0, 5.0, 6.0]).prepare_slot(&i16_slot(127, false)).unwrap_err().to_string();
        assert!(e.contains("tensor #0") && e.contains("-400") && e.contains("±127"), "{e}");
        // A bound no i16 holds is refused before any data is read.
        assert!(w(vec![0.0; 6]).prepare_slot(&i16_slot(40000, false)).is_err());
    }
}
