//! The engine pads inputs and trims outputs with `HostTensor::resized`: exact in every dtype
//! (no trip through f64, which would round i64 ids above 2⁵³ and could touch NaN payloads).

use kiln_runtime::{HostTensor, TensorData};

#[test]
fn pads_and_trims_bit_for_bit() {
    let big = (1i64 << 60) + 1;
    let t = HostTensor::i64(vec![2, 3], vec![1, 2, big, 4, 5, 6]).unwrap();
    let p = t.resized(&[3, 5]);
    assert_eq!(p.as_i64().unwrap(), &[1, 2, big, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(p.resized(&[2, 3]), t);
    let nan = f32::from_bits(0x7fc0_1234);
    let f = HostTensor::f32(vec![1, 2, 2], vec![nan, -0.0, 1.5, f32::INFINITY]).unwrap();
    let g = f.resized(&[2, 3, 2]).resized(&[1, 2, 2]);
    let (TensorData::F32(a), TensorData::F32(b)) = (&f.data, &g.data) else { panic!() };
    assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    let s = HostTensor::f32(vec![], vec![3.0]).unwrap();
    assert_eq!(s.resized(&[]), s);
    let e = HostTensor::f32(vec![0, 2], vec![]).unwrap();
    assert_eq!(e.resized(&[1, 2]).as_f32().unwrap(), &[0.0, 0.0]);
}
