//! The window ops of the ONNX importer (Conv, ConvTranspose, MaxPool, AveragePool) against naive
//! evaluations written here from the spec's definitions, over geometries the node tests leave
//! out (groups with several channels each, dilations with strides, asymmetric pads, SAME_LOWER,
//! ceil_mode with pads, ConvTranspose with groups, dilation, output_padding and an output_shape
//! larger than the input reaches, 1-D and 3-D); and malformed attributes as one-line errors
//! naming the node.

use kiln_compiler::frontends::onnx::proto::{AttributeProto, GraphProto, NodeProto, TensorProto, ValueInfoProto};
use kiln_compiler::frontends::onnx::OnnxModel;
use kiln_compiler::reference::interpret;
use kiln_runtime::{Bucket, Error, HostTensor};
use prost::Message;

fn vi(name: &str, dims: &[usize]) -> ValueInfoProto {
    let d: Vec<Result<i64, &str>> = dims.iter().map(|&v| Ok(v as i64)).collect();
    kiln_testkit::onnx_proto::value_info(name, 1, &d)
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: Some(name.into()), ints: v.to_vec(), r#type: Some(7), ..Default::default() }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), i: Some(v), r#type: Some(2), ..Default::default() }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto { name: Some(name.into()), s: Some(v.as_bytes().to_vec()), r#type: Some(3), ..Default::default() }
}

/// `g` on the reference interpreter and, where that runs it, on the CPU backend (compiled;
/// 2 threads) to the same values within f32 rounding: the reference's outputs.
fn interpret_and_cpu(g: &kiln_runtime::Graph, w: &[HostTensor], inputs: &[HostTensor], b: Bucket) -> Result<Vec<HostTensor>, Error> {
    use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
    use kiln_runtime::cpu::Threads;
    use kiln_runtime::{Backend, Batch, Outputs};
    let want = interpret(g, w, inputs, b)?;
    let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), ..Default::default() })?;
    let uploaded = be.upload(w, g)?;
    let mut plan = be.lower(&uploaded, g, b)?;
    let mut out = Outputs::for_bucket(g, b);
    be.run(&mut plan, &Batch { tensors: inputs.to_vec() }, &mut out)?;
    if let Err(e) = kiln_testkit::random::compare(&out.tensors, &want, 1e-5, 1e-5) {
        panic!("cpu against the reference: {e}");
    }
    Ok(want)
}

/// `op` over graph inputs `ins` (name, shape) into `y`, run by the reference interpreter and
/// the CPU backend.
fn run(op: &str, ins: &[(&str, Vec<usize>, Vec<f32>)], attrs: Vec<AttributeProto>) -> Result<HostTensor, Error> {
    let g = GraphProto {
        node: vec![NodeProto {
            op_type: Some(op.into()),
            name: Some("w".into()),
            input: ins.iter().map(|i| i.0.to_string()).collect(),
            output: vec!["y".into()],
            attribute: attrs,
            ..Default::default()
        }],
        input: ins.iter().map(|(n, s, _)| vi(n, s)).collect(),
        output: vec![kiln_testkit::onnx_proto::value_info("y", 1, &[])],
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.onnx");
    std::fs::write(&p, kiln_testkit::onnx_proto::model(g, 19).encode_to_vec()).unwrap();
    let m = OnnxModel::open(&p, &[])?;
    let b = Bucket::new(1, 1);
    let g = m.graph_for(b)?;
    let w = m.weights(&g)?;
    let inputs: Vec<HostTensor> = ins.iter().map(|(_, s, v)| HostTensor::f32(s.clone(), v.clone()).unwrap()).collect();
    Ok(interpret_and_cpu(&g, &w, &inputs, b)?.remove(0))
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 7.0).collect()
}

/// Row-major multi-index of `flat` in `shape`.
fn unflat(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut v = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        v[d] = flat % shape[d];
        flat /= shape[d];
    }
    v
}

fn flat(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |a, (&i, &s)| a * s + i)
}

/// One convolution's geometry: batch `n`, channels in `c` and out `m` in `g` groups, spatial
/// input `s`, kernel `k`, strides, dilations, begin pads.
struct Geo {
    n: usize,
    c: usize,
    m: usize,
    g: usize,
    s: Vec<usize>,
    k: Vec<usize>,
    st: Vec<usize>,
    dil: Vec<usize>,
    pb: Vec<i64>,
}

/// Conv by its definition: y[n, m, o] = Σ_{c, k} x[n, g·Cg + c, o·st + k·dil - pb]·w[m, c, k].
fn naive_conv(x: &[f32], w: &[f32], geo: &Geo, out: &[usize]) -> Vec<f32> {
    let (n, c, m, g) = (geo.n, geo.c, geo.m, geo.g);
    let (cg, mg) = (c / g, m / g);
    let po: usize = out.iter().product();
    let pk: usize = geo.k.iter().product();
    let mut y = vec![0f32; n * m * po];
    for b in 0..n {
        for mm in 0..m {
            let grp = mm / mg;
            for of in 0..po {
                let o = unflat(of, out);
                let mut acc = 0f64;
                for ci in 0..cg {
                    for kf in 0..pk {
                        let k = unflat(kf, &geo.k);
                        let pos: Vec<i64> = (0..o.len()).map(|j| (o[j] * geo.st[j] + k[j] * geo.dil[j]) as i64 - geo.pb[j]).collect();
                        if pos.iter().zip(&geo.s).any(|(&p, &s)| p < 0 || p >= s as i64) {
                            continue;
                        }
                        let pos: Vec<usize> = pos.iter().map(|&p| p as usize).collect();
                        let xi = (b * c + grp * cg + ci) * geo.s.iter().product::<usize>() + flat(&pos, &geo.s);
                        let wi = (mm * cg + ci) * pk + kf;
                        acc += x[xi] as f64 * w[wi] as f64;
                    }
                }
                y[(b * m + mm) * po + of] = acc as f32;
            }
        }
    }
    y
}

/// ConvTranspose by its definition: y[n, m, o] = Σ x[n, c, i]·w[c, m - g·Mg, k] over
/// i·st + k·dil - pb = o, c in m's group.
fn naive_conv_t(x: &[f32], w: &[f32], geo: &Geo, out: &[usize]) -> Vec<f32> {
    let (n, c, m, g) = (geo.n, geo.c, geo.m, geo.g);
    let (cg, mg) = (c / g, m / g);
    let po: usize = out.iter().product();
    let ps: usize = geo.s.iter().product();
    let pk: usize = geo.k.iter().product();
    let mut y = vec![0f64; n * m * po];
    for b in 0..n {
        for ci in 0..c {
            let grp = ci / cg;
            for sf in 0..ps {
                let i = unflat(sf, &geo.s);
                for kf in 0..pk {
                    let k = unflat(kf, &geo.k);
                    let o: Vec<i64> = (0..i.len()).map(|j| (i[j] * geo.st[j] + k[j] * geo.dil[j]) as i64 - geo.pb[j]).collect();
                    if o.iter().zip(out).any(|(&p, &s)| p < 0 || p >= s as i64) {
                        continue;
                    }
                    let of = flat(&o.iter().map(|&p| p as usize).collect::<Vec<_>>(), out);
                    for mi in 0..mg {
                        let mm = grp * mg + mi;
                        y[(b * m + mm) * po + of] += x[(b * c + ci) * ps + sf] as f64 * w[(ci * mg + mi) * pk + kf] as f64;
                    }
                }
            }
        }
    }
    y.into_iter().map(|v| v as f32).collect()
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{what}: element {i}: {a} vs {b}");
    }
}

#[test]
fn conv_matches_its_definition() {
    // Depthwise cases (C = group, one input channel each) import as a product and a sum over
    // the taps instead of a GEMM per group. (C, M, group, spatial, kernel, strides, dilations, pads [begin.., end..] or auto_pad)
    type Case<'a> = (usize, usize, usize, &'a [usize], &'a [usize], &'a [usize], &'a [usize], Result<&'a [i64], &'a str>);
    let cases: [Case; 15] = [
        (4, 6, 2, &[7, 6], &[3, 2], &[2, 1], &[1, 2], Ok(&[1, 0, 2, 1])),
        // Depthwise without multiplier: shifted views of the padded input (dilated, asymmetric
        // pads, SAME_LOWER, 3-D).
        (5, 5, 5, &[7, 6], &[3, 2], &[1, 1], &[2, 1], Ok(&[2, 0, 1, 1])),
        (6, 6, 6, &[5, 4], &[3, 3], &[1, 1], &[1, 1], Err("SAME_LOWER")),
        (2, 2, 2, &[4, 3, 5], &[2, 2, 3], &[1, 1, 1], &[1, 2, 1], Ok(&[0, 1, 1, 1, 0, 1])),
        // Strided depthwise: each strided axis split into [blocks, stride] (odd sizes, a
        // dilation that is not a multiple of the stride, SAME_UPPER).
        (4, 4, 4, &[9, 8], &[3, 3], &[2, 3], &[1, 2], Ok(&[1, 2, 1, 0])),
        (3, 3, 3, &[7, 7], &[3, 3], &[2, 2], &[1, 1], Err("SAME_UPPER")),
        // Depthwise with a channel multiplier of 2 and 3 (strided, dilated, padded; 1-D).
        (3, 6, 3, &[7, 5], &[3, 2], &[2, 1], &[1, 2], Ok(&[1, 0, 1, 1])),
        (4, 12, 4, &[9], &[3], &[2], &[2], Ok(&[2, 1])),
        (6, 6, 3, &[9, 9], &[3, 3], &[2, 2], &[2, 2], Ok(&[2, 2, 2, 2])),
        (3, 4, 1, &[8, 5], &[3, 3], &[3, 2], &[1, 1], Err("SAME_LOWER")),
        (3, 4, 1, &[8, 5], &[4, 2], &[2, 3], &[1, 1], Err("SAME_UPPER")),
        (2, 3, 1, &[11], &[4], &[3], &[2], Ok(&[3, 1])),
        (2, 2, 2, &[4, 5, 3], &[2, 3, 2], &[1, 2, 1], &[1, 1, 2], Ok(&[1, 0, 1, 0, 2, 1])),
        (8, 8, 8, &[6, 6], &[3, 3], &[1, 1], &[1, 1], Ok(&[1, 1, 1, 1])),
        (5, 3, 1, &[6, 4], &[1, 1], &[1, 1], &[1, 1], Ok(&[0, 0, 0, 0])),
    ];
    for (i, (c, m, g, s, k, st, dil, pads)) in cases.into_iter().enumerate() {
        let d = s.len();
        let n = 2;
        let eff: Vec<usize> = (0..d).map(|j| (k[j] - 1) * dil[j] + 1).collect();
        let (pb, out): (Vec<i64>, Vec<usize>) = match pads {
            Ok(p) => ((0..d).map(|j| p[j]).collect(), (0..d).map(|j| (s[j] + p[j] as usize + p[d + j] as usize - eff[j]) / st[j] + 1).collect()),
            Err(mode) => {
                let out: Vec<usize> = (0..d).map(|j| s[j].div_ceil(st[j])).collect();
                let pb = (0..d)
                    .map(|j| {
                        let total = ((out[j] - 1) * st[j] + eff[j]).saturating_sub(s[j]) as i64;
                        if mode == "SAME_UPPER" { total / 2 } else { total - total / 2 }
                    })
                    .collect();
                (pb, out)
            }
        };
        let xs: Vec<usize> = [n, c].iter().chain(s).copied().collect();
        let ws: Vec<usize> = [m, c / g].iter().chain(k).copied().collect();
        let (x, w) = (values(xs.iter().product(), i), values(ws.iter().product(), i + 5));
        let bias = values(m, i + 9);
        let mut attrs = vec![int("group", g as i64), ints("strides", &st.iter().map(|&v| v as i64).collect::<Vec<_>>()), ints("dilations", &dil.iter().map(|&v| v as i64).collect::<Vec<_>>())];
        match pads {
            Ok(p) => attrs.push(ints("pads", p)),
            Err(mode) => attrs.push(string("auto_pad", mode)),
        }
        let y = run("Conv", &[("x", xs.clone(), x.clone()), ("w", ws, w.clone()), ("b", vec![m], bias.clone())], attrs).unwrap();
        let geo = Geo { n, c, m, g, s: s.to_vec(), k: k.to_vec(), st: st.to_vec(), dil: dil.to_vec(), pb };
        let mut want = naive_conv(&x, &w, &geo, &out);
        let po: usize = out.iter().product();
        for (e, v) in want.iter_mut().enumerate() {
            *v += bias[e / po % m];
        }
        let want_shape: Vec<usize> = [n, m].iter().chain(&out).copied().collect();
        assert_eq!(y.shape, want_shape, "case {i}");
        close(&y.to_f32_vec(), &want, &format!("Conv case {i}"));
    }
}

#[test]
fn conv_transpose_matches_its_definition() {
    // (C, M, group, spatial, kernel, strides, dilations, pads, output_padding, output_shape)
    type Case<'a> = (usize, usize, usize, &'a [usize], &'a [usize], &'a [usize], &'a [usize], &'a [i64], &'a [i64], Option<&'a [i64]>);
    let cases: [Case; 7] = [
        (4, 6, 2, &[3, 4], &[3, 2], &[2, 3], &[1, 2], &[1, 0, 0, 1], &[1, 0], None),
        // Depthwise (one input channel per group), without and with a channel multiplier.
        (5, 5, 5, &[4, 3], &[3, 3], &[2, 1], &[1, 2], &[1, 0, 0, 1], &[1, 0], None),
        (3, 6, 3, &[4, 4], &[2, 3], &[2, 2], &[1, 1], &[0, 1, 1, 0], &[0, 1], None),
        (2, 3, 1, &[5], &[4], &[3], &[1], &[1, 2], &[2], None),
        (3, 2, 1, &[3, 3], &[3, 3], &[3, 2], &[1, 1], &[0, 0, 0, 0], &[0, 0], Some(&[10, 8])),
        (6, 6, 3, &[4, 4], &[2, 2], &[2, 2], &[2, 1], &[0, 1, 1, 0], &[0, 0], None),
        (2, 2, 1, &[2, 3, 2], &[2, 2, 2], &[2, 1, 2], &[1, 1, 1], &[0, 0, 1, 1, 0, 0], &[1, 0, 0], None),
    ];
    for (i, (c, m, g, s, k, st, dil, pads, op, out_shape)) in cases.into_iter().enumerate() {
        let d = s.len();
        let n = 2;
        let full: Vec<usize> = (0..d).map(|j| st[j] * (s[j] - 1) + op[j] as usize + (k[j] - 1) * dil[j] + 1).collect();
        let (pb, out): (Vec<i64>, Vec<usize>) = match out_shape {
            // ONNX: total padding = full - output, the odd one at the begin (NOTSET), Python's floor.
            Some(o) => ((0..d).map(|j| { let t = full[j] as i64 - o[j]; t - t.div_euclid(2) }).collect(), o.iter().map(|&v| v as usize).collect()),
            None => ((0..d).map(|j| pads[j]).collect(), (0..d).map(|j| full[j] - pads[j] as usize - pads[d + j] as usize).collect()),
        };
        let xs: Vec<usize> = [n, c].iter().chain(s).copied().collect();
        let ws: Vec<usize> = [c, m / g].iter().chain(k).copied().collect();
        let (x, w) = (values(xs.iter().product(), i + 2), values(ws.iter().product(), i + 7));
        let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        let mut attrs = vec![int("group", g as i64), ints("strides", &as_i64(st)), ints("dilations", &as_i64(dil)), ints("output_padding", op)];
        match out_shape {
            Some(o) => attrs.push(ints("output_shape", o)),
            None => attrs.push(ints("pads", pads)),
        }
        let y = run("ConvTranspose", &[("x", xs, x.clone()), ("w", ws, w.clone())], attrs).unwrap();
        let geo = Geo { n, c, m, g, s: s.to_vec(), k: k.to_vec(), st: st.to_vec(), dil: dil.to_vec(), pb };
        let want = naive_conv_t(&x, &w, &geo, &out);
        let want_shape: Vec<usize> = [n, m].iter().chain(&out).copied().collect();
        assert_eq!(y.shape, want_shape, "case {i}");
        close(&y.to_f32_vec(), &want, &format!("ConvTranspose case {i}"));
    }
}

/// MaxPool and AveragePool (both count_include_pad settings) with ceil_mode, pads, strides and
/// dilations: windows of the padded input, the last one starting inside the input or its
/// begin padding; an average over the positions inside the input, or inside the input and its
/// pads (not the ceil_mode overhang).
#[test]
fn pools_match_their_definition() {
    let (n, c, s, k, st, dil, pb, pe) = (1usize, 2usize, [7usize, 6usize], [3usize, 2usize], [2usize, 2usize], [1usize, 2usize], [1usize, 0usize], [1usize, 1usize]);
    let x = values(n * c * s[0] * s[1], 3);
    let out: Vec<usize> = (0..2)
        .map(|j| {
            let q = s[j] + pb[j] + pe[j] - ((k[j] - 1) * dil[j] + 1);
            let mut o = q.div_ceil(st[j]) + 1;
            if (o - 1) * st[j] >= s[j] + pb[j] {
                o -= 1;
            }
            o
        })
        .collect();
    let attrs = |extra: Vec<AttributeProto>| {
        let mut a = vec![ints("kernel_shape", &[3, 2]), ints("strides", &[2, 2]), ints("dilations", &[1, 2]), ints("pads", &[1, 0, 1, 1]), int("ceil_mode", 1)];
        a.extend(extra);
        a
    };
    for (op, include) in [("MaxPool", false), ("AveragePool", false), ("AveragePool", true)] {
        let extra = if op == "AveragePool" { vec![int("count_include_pad", include as i64)] } else { vec![] };
        let y = run(op, &[("x", vec![n, c, s[0], s[1]], x.clone())], attrs(extra)).unwrap();
        let mut want = Vec::new();
        for ch in 0..c {
            for o0 in 0..out[0] {
                for o1 in 0..out[1] {
                    let (mut best, mut sum, mut count) = (f32::NEG_INFINITY, 0f64, 0usize);
                    for k0 in 0..k[0] {
                        for k1 in 0..k[1] {
                            let p = [(o0 * st[0] + k0 * dil[0]) as i64 - pb[0] as i64, (o1 * st[1] + k1 * dil[1]) as i64 - pb[1] as i64];
                            let inside = p[0] >= 0 && p[0] < s[0] as i64 && p[1] >= 0 && p[1] < s[1] as i64;
                            let in_pads = (0..2).all(|j| p[j] >= -(pb[j] as i64) && p[j] < (s[j] + pe[j]) as i64);
                            if inside {
                                let v = x[(ch * s[0] + p[0] as usize) * s[1] + p[1] as usize];
                                best = best.max(v);
                                sum += v as f64;
                            }
                            if inside || (include && in_pads) {
                                count += 1;
                            }
                        }
                    }
                    want.push(if op == "MaxPool" { best } else { (sum / count as f64) as f32 });
                }
            }
        }
        assert_eq!(y.shape, vec![n, c, out[0], out[1]], "{op}");
        close(&y.to_f32_vec(), &want, &format!("{op} count_include_pad={include}"));
    }
}

/// Bad window attributes are one-line errors naming the node, never a panic or an abort (the
/// absurd sizes included).
#[test]
fn malformed_window_ops_name_the_node() {
    let x = || ("x", vec![1, 4, 5, 5], vec![0.0; 100]);
    let w = |s: Vec<usize>| {
        let n = s.iter().product();
        ("w", s, vec![0.0; n])
    };
    type Input<'a> = (&'a str, Vec<usize>, Vec<f32>);
    let cases: Vec<(&str, Vec<Input>, Vec<AttributeProto>, &str)> = vec![
        ("Conv", vec![x(), w(vec![6, 4, 3, 3])], vec![int("group", 3)], "weight of shape [6, 4, 3, 3] for 4 input channels in 3 groups"),
        ("Conv", vec![x(), w(vec![6, 4, 3, 3])], vec![ints("kernel_shape", &[2, 2])], "kernel_shape [2, 2] and a weight of shape [6, 4, 3, 3]"),
        ("Conv", vec![x(), w(vec![6, 4, 3, 3])], vec![ints("pads", &[1, 1])], "pads [1, 1] for 2 spatial axes"),
        ("Conv", vec![x(), w(vec![6, 4, 3, 3])], vec![ints("dilations", &[1 << 40, 1])], "dilations [1099511627776, 1] for 2 spatial axes"),
        ("Conv", vec![x(), w(vec![6, 4, 9, 3])], vec![], "a window of 9 over 5 (pads included) along spatial axis 0"),
        ("Conv", vec![x(), w(vec![6, 4, 3, 3])], vec![string("auto_pad", "SAME")], "auto_pad `SAME`"),
        ("ConvTranspose", vec![x(), w(vec![4, 2, 3, 3])], vec![ints("output_shape", &[1 << 30, 5])], "output_shape [1073741824, 5]"),
        ("MaxPool", vec![x()], vec![], "no kernel_shape"),
        ("MaxPool", vec![x()], vec![ints("kernel_shape", &[2, 2]), int("ceil_mode", 1), string("auto_pad", "VALID")], "ceil_mode with auto_pad"),
        ("LpPool", vec![x()], vec![ints("kernel_shape", &[2, 2]), int("p", 0)], "p = 0"),
    ];
    for (op, ins, attrs, want) in cases {
        let e = run(op, &ins, attrs).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("node `w` ({op}")) && msg.contains(want) && !msg.contains('\n'), "{op}: want `{want}`: {msg}");
    }
}

fn f32_tensor(name: &str, shape: &[usize], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(1),
        dims: shape.iter().map(|&d| d as i64).collect(),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// The model of `nodes` over input `x` (shape `xs`) and f32 initializers `init`, written to
/// `dir/file`, imported for `b`: its graph, weights and IR after the middle end's `dce`.
fn chain_model(dir: &std::path::Path, file: &str, nodes: Vec<NodeProto>, xs: &[usize], init: &[(&str, Vec<usize>, Vec<f32>)], b: Bucket) -> (kiln_runtime::Graph, Vec<HostTensor>, String) {
    let g = GraphProto {
        node: nodes,
        input: vec![vi("x", xs)],
        initializer: init.iter().map(|(name, shape, v)| f32_tensor(name, shape, v)).collect(),
        output: vec![kiln_testkit::onnx_proto::value_info("y", 1, &[])],
        ..Default::default()
    };
    let p = dir.join(file);
    std::fs::write(&p, kiln_testkit::onnx_proto::model(g, 19).encode_to_vec()).unwrap();
    let m = OnnxModel::open(&p, &[]).unwrap();
    let graph = m.graph_for(b).unwrap();
    let w = m.weights(&graph).unwrap();
    let dump = kiln_compiler::pipeline::dump_after(&graph, b, "dce").unwrap();
    (graph, w, dump)
}

/// A node of the chain test: op, inputs, output, attributes.
fn nd(op: &str, ins: &[&str], out: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(out.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute: attrs,
        ..Default::default()
    }
}

#[test]
fn conv_chains_stay_in_rows_of_channels() {
    // x → Conv → BatchNormalization → Relu → Add(x) → Conv → Sigmoid·2 → y: between the two
    // convolutions every op runs on rows of channels, so after the middle end the only
    // transposes left are x's (read by the first Conv and the residual Add) and y's. The
    // result equals the ops run one graph each (where every op transposes in and out).
    let (n, c, s) = (2usize, 4usize, 5usize);
    let xs = vec![n, c, s, s];
    let ws = vec![c, c, 3, 3];
    let x = values(xs.iter().product(), 1);
    let (w1, w2) = (values(ws.iter().product(), 2), values(ws.iter().product(), 3));
    let (b1, b2) = (values(c, 4), values(c, 5));
    let bn: Vec<Vec<f32>> = (0..4).map(|k| values(c, 6 + k).iter().map(|v| if k == 3 { v.abs() + 0.5 } else { *v }).collect()).collect();
    let pads = || vec![ints("pads", &[1, 1, 1, 1])];
    let two = vec![2.0f32];
    let mut init: Vec<(&str, Vec<usize>, Vec<f32>)> = vec![
        ("w1", ws.clone(), w1.clone()),
        ("b1", vec![c], b1.clone()),
        ("w2", ws.clone(), w2.clone()),
        ("b2", vec![c], b2.clone()),
        ("two", vec![], two.clone()),
    ];
    for (k, name) in ["scale", "shift", "mean", "var"].iter().enumerate() {
        init.push((name, vec![c], bn[k].clone()));
    }
    let dir = tempfile::tempdir().unwrap();
    let b = Bucket::new(1, 1);
    let nodes = vec![
        nd("Conv", &["x", "w1", "b1"], "c1", pads()),
        nd("BatchNormalization", &["c1", "scale", "shift", "mean", "var"], "bn", vec![]),
        nd("Relu", &["bn"], "r", vec![]),
        nd("Add", &["r", "x"], "res", vec![]),
        nd("Conv", &["res", "w2", "b2"], "c2", pads()),
        nd("Sigmoid", &["c2"], "sg", vec![]),
        nd("Mul", &["sg", "two"], "y", vec![]),
    ];
    let (graph, w, dump) = chain_model(dir.path(), "m.onnx", nodes, &xs, &init, b);
    let transposes = dump.lines().filter(|l| l.contains("= transpose(")).count();
    assert_eq!(transposes, 2, "transposes left in\n{dump}");
    let got = interpret_and_cpu(&graph, &w, &[HostTensor::f32(xs.clone(), x.clone()).unwrap()], b).unwrap().remove(0);

    let t = |v: &[f32], shape: &[usize]| (shape.to_vec(), v.to_vec());
    let conv = |x: &[f32], w: &[f32], bias: &[f32]| {
        run("Conv", &[("x", xs.clone(), x.to_vec()), ("w", ws.clone(), w.to_vec()), ("b", vec![c], bias.to_vec())], pads()).unwrap().to_f32_vec()
    };
    let c1 = conv(&x, &w1, &b1);
    let norm = |v: &[f32]| {
        let ins: Vec<(&str, Vec<usize>, Vec<f32>)> =
            [("x", t(v, &xs))].into_iter().chain(["scale", "shift", "mean", "var"].iter().zip(&bn).map(|(k, v)| (*k, t(v, &[c])))).map(|(k, (s, v))| (k, s, v)).collect();
        run("BatchNormalization", &ins, vec![]).unwrap().to_f32_vec()
    };
    let y_bn = norm(&c1);
    let r = run("Relu", &[("x", xs.clone(), y_bn)], vec![]).unwrap().to_f32_vec();
    let res = run("Add", &[("a", xs.clone(), r), ("b", xs.clone(), x.clone())], vec![]).unwrap().to_f32_vec();
    let c2 = conv(&res, &w2, &b2);
    let sg = run("Sigmoid", &[("x", xs.clone(), c2)], vec![]).unwrap().to_f32_vec();
    let want = run("Mul", &[("a", xs.clone(), sg), ("b", vec![], two)], vec![]).unwrap().to_f32_vec();
    assert_eq!(got.shape, xs);
    close(&got.to_f32_vec(), &want, "conv chain");

    // The BatchNormalization folded into its Conv (its only reader): one GEMM, no multiply
    // left for the norm. With a second reader of the Conv's output it stays a norm.
    let kernels = |dump: &str, op: &str| dump.lines().filter(|l| l.contains(&format!("= {op}("))).count();
    assert_eq!(kernels(&dump, "mul"), 1, "the norm folded (one mul: Sigmoid·2)\n{dump}");
    let nodes = vec![
        nd("Conv", &["x", "w1", "b1"], "c1", pads()),
        nd("BatchNormalization", &["c1", "scale", "shift", "mean", "var"], "bn", vec![]),
        nd("Relu", &["c1"], "r", vec![]),
        nd("Add", &["bn", "r"], "y", vec![]),
    ];
    let (graph2, w2s, dump2) = chain_model(dir.path(), "m2.onnx", nodes, &xs, &init, b);
    assert_eq!(kernels(&dump2, "mul"), 1, "the norm kept: its multiply\n{dump2}");
    let got2 = interpret_and_cpu(&graph2, &w2s, &[HostTensor::f32(xs.clone(), x.clone()).unwrap()], b).unwrap().remove(0);
    let r1 = run("Relu", &[("x", xs.clone(), c1.clone())], vec![]).unwrap().to_f32_vec();
    let bn1 = norm(&c1);
    let want2 = run("Add", &[("a", xs.clone(), bn1), ("b", xs.clone(), r1)], vec![]).unwrap().to_f32_vec();
    close(&got2.to_f32_vec(), &want2, "conv read by a norm and a relu");
}
