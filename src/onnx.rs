//! The CLI's ONNX commands: running an imported model on concrete inputs (`kiln run`), the ONNX
//! backend-test runner (`kiln onnx-test`: `model.onnx` + `test_data_set_*/{input,output}_*.pb`,
//! the layout of onnx's own test data and of onnxruntime's onnx_test_runner), and the op survey
//! (`kiln onnx-ops`).

use std::path::{Path, PathBuf};

use kiln_compiler::frontends::onnx::proto::TensorProto;
use kiln_compiler::frontends::onnx::tensor::lit_from_tensor;
use kiln_compiler::frontends::onnx::{DimRole, OnnxModel};
use kiln_runtime::{Backend, Batch, Bucket, Error, HostTensor, Outputs, Result};
use prost::Message;

use crate::BackendKind;

/// Runs `model` on `inputs` (one per model input, in order; converted to the input's dtype) and
/// returns every graph output, in order.
pub fn run_model(model: &OnnxModel, inputs: &[HostTensor], kind: BackendKind) -> Result<Vec<HostTensor>> {
    if inputs.len() != model.inputs.len() {
        return Err(Error::bad_batch(format!(
            "{} takes {} inputs ({}), {} given",
            model.path.display(),
            model.inputs.len(),
            model.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
            inputs.len()
        )));
    }
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape.clone()).collect();
    // Shape-tensor inputs are compiled in (this is a one-shot run of these very inputs), and
    // so are empty ones (kiln has no empty tensors: an empty input is a known literal, which
    // reductions and concatenations take as ONNX defines them).
    let known: Vec<Option<HostTensor>> =
        model.shape_inputs().iter().zip(inputs).map(|(&s, t)| (s || t.shape.contains(&0)).then(|| t.clone())).collect();
    let graph = model.import_with(&shapes, &known)?;
    let weights = model.weights(&graph)?;
    let inputs: Vec<HostTensor> = inputs
        .iter()
        .zip(&known)
        .filter(|(_, k)| k.is_none())
        .map(|(t, _)| t)
        .zip(&graph.inputs)
        .map(|(t, spec)| HostTensor { shape: t.shape.clone(), data: t.data.convert(spec.dtype) })
        .collect();
    // Every dim is concrete: the bucket only names the plan.
    let bucket = Bucket::new(1, 1);
    match kind {
        BackendKind::Reference => kiln_compiler::reference::interpret(&graph, &weights, &inputs, bucket),
        BackendKind::Cpu => run_on(&kiln_compiler::backends::cpu::CpuBackend::new()?, &graph, &weights, inputs, bucket),
        BackendKind::Cuda => run_on(&kiln_compiler::backends::cuda::CudaBackend::new()?, &graph, &weights, inputs, bucket),
    }
}

fn run_on<B: Backend>(be: &B, graph: &kiln_runtime::Graph, weights: &[HostTensor], inputs: Vec<HostTensor>, bucket: Bucket) -> Result<Vec<HostTensor>> {
    let w = be.upload(weights, graph)?;
    let mut plan = be.lower(&w, graph, bucket)?;
    let mut out = Outputs::for_bucket(graph, bucket);
    be.run(&mut plan, &Batch { tensors: inputs }, &mut out)?;
    Ok(out.tensors)
}

/// Reads one `TensorProto` file (`input_0.pb`, ...).
pub fn read_pb(path: &Path) -> Result<HostTensor> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
    let t = TensorProto::decode(bytes.as_slice())
        .map_err(|e| Error::Model { path: path.to_path_buf(), message: format!("not a TensorProto: {e}") })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let lit = lit_from_tensor(&t, dir).map_err(|m| Error::Model { path: path.to_path_buf(), message: m })?;
    Ok(lit.to_host())
}

/// The outcome of one backend test.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Unsupported(String),
}

/// Max abs error of `got` against `want`, or why they cannot be compared. Floats pass within
/// `atol + rtol·|want|`: rtol 1e-3 as onnx's backend tests use for f32, looser for the 11- and
/// 8-bit mantissas of f16 and bf16 (one rounding is already 5e-4 and 4e-3); integers exactly.
fn compare(got: &HostTensor, want: &HostTensor) -> std::result::Result<f64, String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    let (g, w) = (got.data.to_f64_vec(), want.data.to_f64_vec());
    let (rtol, atol) = match want.dtype() {
        kiln_runtime::DType::F16 => (5e-3, 1e-3),
        kiln_runtime::DType::BF16 => (2e-2, 1e-2),
        _ => (1e-3, 1e-5),
    };
    let mut worst = 0f64;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same_special = (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b);
        let err = (a - b).abs();
        let within = err <= atol + rtol * b.abs();
        if !same_special && !within {
            return Err(format!("element {i}: {a} vs {b} (abs err {err:.3e})"));
        }
        if !same_special {
            worst = worst.max(err);
        }
    }
    Ok(worst)
}

/// Runs one test directory.
pub fn run_test_dir(dir: &Path, kind: BackendKind) -> Outcome {
    let model = match OnnxModel::open(&dir.join("model.onnx"), &[]) {
        Ok(m) => m,
        Err(Error::Unsupported(m)) => return Outcome::Unsupported(m),
        Err(e) => return Outcome::Fail(e.to_string()),
    };
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))).collect(),
        Err(e) => return Outcome::Fail(format!("{}: {e}", dir.display())),
    };
    sets.sort();
    if sets.is_empty() {
        return Outcome::Fail("no test_data_set_* folder".into());
    }
    let mut worst = 0f64;
    for set in sets {
        let files = |prefix: &str| -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = (0..).map(|i| set.join(format!("{prefix}_{i}.pb"))).take_while(|p| p.exists()).collect();
            v.shrink_to_fit();
            v
        };
        let read = |ps: Vec<PathBuf>| ps.iter().map(|p| read_pb(p)).collect::<Result<Vec<_>>>();
        let (inputs, want) = match (read(files("input")), read(files("output"))) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(Error::Model { message, .. }), _) | (_, Err(Error::Model { message, .. })) if message.contains("not supported") => {
                return Outcome::Unsupported(message)
            }
            (Err(e), _) | (_, Err(e)) => return Outcome::Fail(e.to_string()),
        };
        let got = match run_model(&model, &inputs, kind) {
            Ok(g) => g,
            Err(Error::Unsupported(m)) => return Outcome::Unsupported(m),
            Err(e) => return Outcome::Fail(e.to_string()),
        };
        if got.len() != want.len() {
            return Outcome::Fail(format!("{} outputs, expected {}", got.len(), want.len()));
        }
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            match compare(g, w) {
                Ok(e) => worst = worst.max(e),
                Err(m) => return Outcome::Fail(format!("{}: output {k}: {m}", set.file_name().unwrap_or_default().to_string_lossy())),
            }
        }
    }
    let _ = worst;
    Outcome::Pass
}

/// `kiln onnx-test DIR...`: one line per test, then the totals. Each DIR is a test folder or a
/// folder of them.
pub fn onnx_test(dirs: &[PathBuf], kind: BackendKind) -> Result<(usize, usize, usize)> {
    let mut tests = Vec::new();
    for d in dirs {
        if d.join("model.onnx").is_file() {
            tests.push(d.clone());
        } else {
            let rd = std::fs::read_dir(d).map_err(|e| Error::io(d, &e))?;
            let mut sub: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.join("model.onnx").is_file()).collect();
            sub.sort();
            tests.extend(sub);
        }
    }
    let (mut pass, mut fail, mut unsup) = (0, 0, 0);
    for t in &tests {
        let name = t.file_name().unwrap_or_default().to_string_lossy().to_string();
        // A panic would be a kiln bug: count it as a failure and go on.
        let outcome = std::panic::catch_unwind(|| run_test_dir(t, kind))
            .unwrap_or_else(|_| Outcome::Fail("kiln panicked (a bug)".into()));
        match outcome {
            Outcome::Pass => {
                pass += 1;
                println!("pass        {name}");
            }
            Outcome::Fail(m) => {
                fail += 1;
                println!("FAIL        {name}: {}", m.replace('\n', " "));
            }
            Outcome::Unsupported(m) => {
                unsup += 1;
                println!("unsupported {name}: {}", m.replace('\n', " "));
            }
        }
    }
    println!("{pass} passed, {fail} failed, {unsup} unsupported");
    Ok((pass, fail, unsup))
}

/// How `embed --onnx` turns a rank-3 output (per-token states) into one vector per text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the text's real tokens (attention mask 1), then L2-normalized.
    Mean,
    /// The first token's state, L2-normalized.
    Cls,
    /// The last real token's state, L2-normalized: how decoder-only embedders pool (a causal
    /// model's last token has seen the whole text; TEI's `last-token`). kiln pads on the right.
    Last,
    /// No pooling: a rank-2 output as it is (a rank-3 one is refused).
    None,
}

/// The index of the output named `output` (None: the first) of an ONNX model's graph, or a
/// one-line error listing the outputs.
pub fn output_index(graph: &kiln_runtime::Graph, output: Option<&str>, model_path: &Path) -> Result<usize> {
    match output {
        Some(n) => graph.output_names.iter().position(|o| o == n).ok_or_else(|| {
            Error::bad_batch(format!("{} has no output `{n}` (outputs: {})", model_path.display(), graph.output_names.join(", ")))
        }),
        None => Ok(0),
    }
}

/// `e / max(‖e‖, 1e-12)`, the norm in f64.
pub fn l2_normalize(mut e: Vec<f32>) -> Vec<f32> {
    let n = e.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt().max(1e-12);
    e.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
    e
}

/// One vector per text from `t`, not normalized: a rank-2 output's rows, or a rank-3 output's
/// mean over each text's real tokens (`Mean`), its first token (`Cls`) or its last real token
/// (`Last`).
pub fn pool_raw(t: &HostTensor, seqs: &[Vec<i64>], pooling: Pooling) -> std::result::Result<Vec<Vec<f32>>, String> {
    let v = t.to_f32_vec();
    match (t.shape.len(), pooling) {
        // Rows past the texts are a fixed batch dim's padding.
        (2, _) => Ok(v.chunks(t.shape[1].max(1)).take(seqs.len()).map(|c| c.to_vec()).collect()),
        (3, Pooling::None) => Err("is per token (rank 3): choose --pooling mean, cls or last".into()),
        (3, p) => {
            let (s, d) = (t.shape[1], t.shape[2]);
            Ok(seqs
                .iter()
                .enumerate()
                .map(|(r, q)| {
                    let real = q.len().min(s).max(1);
                    let tokens = match p {
                        Pooling::Cls => 0..1,
                        Pooling::Last => real - 1..real,
                        _ => 0..real,
                    };
                    let n = tokens.len();
                    let mut e = vec![0f64; d];
                    for tk in tokens {
                        for (c, x) in e.iter_mut().enumerate() {
                            *x += v[(r * s + tk) * d + c] as f64;
                        }
                    }
                    e.iter().map(|x| (x / n as f64) as f32).collect()
                })
                .collect())
        }
        (r, _) => Err(format!("has rank {r}; an embedding output has rank 2 or 3")),
    }
}

/// Reads a numpy `.npy` file into a kiln tensor: f32 and f64 (as f32), and the integer and
/// bool types (as i64).
pub fn read_npy(path: &Path) -> Result<HostTensor> {
    let bad = |m: String| Error::Model { path: path.to_path_buf(), message: m };
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(f)).map_err(|e| bad(format!("not a .npy file: {e}")))?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    if npy.order() != npyz::Order::C {
        return Err(bad("Fortran-order arrays are not supported (save with np.ascontiguousarray)".into()));
    }
    let descr = match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string(),
        other => return Err(bad(format!("dtype {other:?} is not a plain numeric type"))),
    };
    use kiln_runtime::TensorData as T;
    let data = match descr.trim_start_matches(['<', '|', '=']) {
        "f4" => T::F32(npy.into_vec::<f32>().map_err(|x| bad(x.to_string()))?),
        "f8" => T::F32(npy.into_vec::<f64>().map_err(|x| bad(x.to_string()))?.into_iter().map(|x| x as f32).collect()),
        "i8" => T::I64(npy.into_vec::<i64>().map_err(|x| bad(x.to_string()))?),
        "i4" => T::I64(npy.into_vec::<i32>().map_err(|x| bad(x.to_string()))?.into_iter().map(i64::from).collect()),
        "i2" => T::I64(npy.into_vec::<i16>().map_err(|x| bad(x.to_string()))?.into_iter().map(i64::from).collect()),
        "i1" => T::I64(npy.into_vec::<i8>().map_err(|x| bad(x.to_string()))?.into_iter().map(i64::from).collect()),
        "u1" => T::I64(npy.into_vec::<u8>().map_err(|x| bad(x.to_string()))?.into_iter().map(i64::from).collect()),
        "b1" => T::I64(npy.into_vec::<bool>().map_err(|x| bad(x.to_string()))?.into_iter().map(i64::from).collect()),
        d => return Err(bad(format!("dtype `{descr}` ({d}) is not supported"))),
    };
    HostTensor::new(shape, data).map_err(|e| bad(e.to_string()))
}

/// Writes `t` as a new `.npy` file (f32, or i64 for integer tensors); an existing file is an
/// error, never overwritten.
pub fn write_npy(path: &Path, t: &HostTensor) -> Result<()> {
    use npyz::WriterBuilder;
    let io = |e: std::io::Error| Error::io(path, &e);
    let f = std::fs::File::create_new(path).map_err(io)?;
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let w = std::io::BufWriter::new(f);
    if t.dtype().is_int() {
        let v: Vec<i64> = t.data.to_f64_vec().into_iter().map(|x| x as i64).collect();
        let mut wr = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(w).begin_nd().map_err(io)?;
        wr.extend(v).map_err(io)?;
        wr.finish().map_err(io)
    } else {
        let mut wr = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(w).begin_nd().map_err(io)?;
        wr.extend(t.to_f32_vec()).map_err(io)?;
        wr.finish().map_err(io)
    }
}

/// `--dim NAME=batch|seq` arguments: which symbolic dim of an ONNX model is which.
pub fn parse_dims(args: &[String]) -> Result<Vec<(String, DimRole)>> {
    args.iter()
        .map(|a| {
            let (name, role) = a.split_once('=').ok_or_else(|| Error::bad_batch(format!("--dim `{a}` is not NAME=batch or NAME=seq")))?;
            let role = match role {
                "batch" => DimRole::Batch,
                "seq" | "sequence" => DimRole::Seq,
                _ => return Err(Error::bad_batch(format!("--dim `{a}`: the role is `batch` or `seq`, not `{role}`"))),
            };
            Ok((name.to_string(), role))
        })
        .collect()
}

/// `kiln run --onnx FILE --input NAME=FILE.npy ... --output-dir DIR`: every graph output, in
/// order, to `DIR/output_K.npy`.
pub fn run_cli(file: &Path, dims: &[(String, DimRole)], inputs: &[String], out_dir: &Path, kind: BackendKind) -> Result<Vec<PathBuf>> {
    let model = OnnxModel::open(file, dims)?;
    let mut given: Vec<Option<HostTensor>> = vec![None; model.inputs.len()];
    for spec in inputs {
        let (name, path) = spec.split_once('=').ok_or_else(|| Error::bad_batch(format!("--input `{spec}` is not NAME=FILE.npy")))?;
        let k = model.inputs.iter().position(|i| i.name == name).ok_or_else(|| {
            Error::bad_batch(format!(
                "{} has no input `{name}` (inputs: {})",
                file.display(),
                model.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            ))
        })?;
        given[k] = Some(read_npy(Path::new(path))?);
    }
    let missing: Vec<&str> = model.inputs.iter().zip(&given).filter(|(_, g)| g.is_none()).map(|(i, _)| i.name.as_str()).collect();
    if !missing.is_empty() {
        return Err(Error::bad_batch(format!("missing --input for {}", missing.join(", "))));
    }
    let given: Vec<HostTensor> = given.into_iter().flatten().collect();
    let outs = run_model(&model, &given, kind)?;
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, &e))?;
    let mut written = Vec::new();
    for (k, t) in outs.iter().enumerate() {
        let p = out_dir.join(format!("output_{k}.npy"));
        write_npy(&p, t)?;
        written.push(p);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of 3 and 2 real tokens in a [2, 3, 2] output: the mean over the real ones, the
    /// first, the last real one (the padded position of row 1 is never read).
    #[test]
    fn pooling_reads_the_real_tokens() {
        let v: Vec<f32> = vec![1., 10., 2., 20., 3., 30., 4., 40., 5., 50., 99., 99.];
        let t = HostTensor::f32(vec![2, 3, 2], v).unwrap();
        let seqs = vec![vec![7, 8, 9], vec![7, 8]];
        let pool = |p| pool_raw(&t, &seqs, p).unwrap();
        assert_eq!(pool(Pooling::Mean), [vec![2., 20.], vec![4.5, 45.]]);
        assert_eq!(pool(Pooling::Cls), [vec![1., 10.], vec![4., 40.]]);
        assert_eq!(pool(Pooling::Last), [vec![3., 30.], vec![5., 50.]]);
        assert!(pool_raw(&t, &seqs, Pooling::None).unwrap_err().contains("last"));
    }
}
