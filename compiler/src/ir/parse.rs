//! Reads the text form that [`super::print`] writes back into a graph, so that golden tests can
//! start from text (see `tests/golden/filecheck/`). Every node is pushed through shape inference
//! ([`GraphExt::push_shaped`]) with its printed type as the recorded shape, and the printed type
//! must equal the inferred one: a text graph is checked exactly like a built one. Node names are
//! not in the text; parsed nodes are named `%i`.
//!
//! Hand-written rather than generated (pest, nom): the grammar is one line per item, and this
//! keeps the op spellings next to [`Op::name`]'s without another dependency.

use kiln_runtime::graph::{Dim, Graph, InputRole, InputSpec, Op, ReduceOp, ValueId, WeightSpec};
use kiln_runtime::{DType, Error, Result};

use super::GraphExt;
use crate::ops;

/// Parses a printed graph. Errors name the line at fault.
pub fn parse(text: &str) -> Result<Graph> {
    let mut g = Graph::default();
    for (ln, raw) in text.lines().enumerate() {
        let line = raw.split(" ; ").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with("//") {
            continue;
        }
        parse_line(&mut g, line).map_err(|m| Error::graph(format!("line {}", ln + 1), format!("{m}: `{line}`")))?;
    }
    g.validate(None)?;
    Ok(g)
}

type Msg = String;

fn parse_line(g: &mut Graph, line: &str) -> std::result::Result<(), Msg> {
    if let Some(rest) = line.strip_prefix("input ") {
        let (index, rest) = rest.split_once(' ').ok_or("expected `input N \"name\": type`")?;
        want_index(index, g.inputs.len())?;
        let (name, rest) = quoted(rest)?;
        let rest = rest.strip_prefix(": ").ok_or("expected `: ` after the input name")?;
        let (ty, role) = rest.rsplit_once(' ').ok_or("expected a role after the type")?;
        let (dtype, shape) = parse_type(ty)?;
        let role = match role {
            "(TokenIds)" => InputRole::TokenIds,
            "(AttentionMask)" => InputRole::AttentionMask,
            "(TokenTypes)" => InputRole::TokenTypes,
            "(PositionIds)" => InputRole::PositionIds,
            "(Other)" => InputRole::Other,
            r => return Err(format!("unknown input role {r}")),
        };
        g.inputs.push(InputSpec { name, dtype, shape, role });
    } else if let Some(rest) = line.strip_prefix("weight ") {
        let (index, rest) = rest.split_once(' ').ok_or("expected `weight N \"name\": type`")?;
        want_index(index, g.weights.len())?;
        let (name, rest) = quoted(rest)?;
        let ty = rest.strip_prefix(": ").ok_or("expected `: ` after the weight name")?;
        // An optional ` ints ≤ N` after the type: the weight's integer bound.
        let (ty, int_bound) = match ty.split_once(" ints ≤ ") {
            Some((t, b)) => (t, Some(b.parse::<u32>().map_err(|e| format!("bad integer bound `{b}`: {e}"))?)),
            None => (ty, None),
        };
        let (dtype, shape) = parse_type(ty)?;
        let shape = shape.iter().map(|d| d.fixed().ok_or("a weight's dims are numbers")).collect::<std::result::Result<_, _>>()?;
        g.weights.push(WeightSpec { name, dtype, shape, int_bound });
    } else if let Some(rest) = line.strip_prefix("output ") {
        let (name, rest) = quoted(rest)?;
        let v = value(rest.strip_prefix(" = ").ok_or("expected ` = %N`")?, g.nodes.len())?;
        g.outputs.push(v);
        g.output_names.push(name);
    } else if let Some(rest) = line.strip_prefix('%') {
        let (index, rest) = rest.split_once(" = ").ok_or("expected `%N = op(args) : type`")?;
        want_index(index, g.nodes.len())?;
        let (lhs, ty) = rest.rsplit_once(" : ").ok_or("expected ` : type` at the end")?;
        let (dtype, shape) = parse_type(ty)?;
        // A weight node ends in its quoted name, which the table already holds.
        let lhs = match lhs.find(") \"") {
            Some(i) if lhs.starts_with("weight#") => &lhs[..i + 1],
            _ => lhs,
        };
        let open = lhs.rfind('(').ok_or("expected `(args)`")?;
        let args = lhs[open + 1..].strip_suffix(')').ok_or("expected `)` after the arguments")?;
        let inputs = if args.trim().is_empty() {
            vec![]
        } else {
            args.split(',').map(|a| value(a.trim(), g.nodes.len())).collect::<std::result::Result<Vec<_>, _>>()?
        };
        let op = parse_op(&lhs[..open])?;
        let name = format!("%{index}");
        let v = g.push_shaped(&name, op, inputs, Some(shape.clone())).map_err(|e| e.to_string())?;
        let n = g.node(v);
        if n.dtype != dtype || n.shape != shape {
            return Err(format!("printed type differs from the inferred {} {}", n.dtype, kiln_runtime::graph::fmt_shape(&n.shape)));
        }
    } else {
        return Err("expected `input`, `weight`, `%N =` or `output`".into());
    }
    Ok(())
}

fn want_index(s: &str, next: usize) -> std::result::Result<(), Msg> {
    match s.parse::<usize>() {
        Ok(i) if i == next => Ok(()),
        _ => Err(format!("expected index {next}, found `{s}`")),
    }
}

fn value(s: &str, defined: usize) -> std::result::Result<ValueId, Msg> {
    match s.strip_prefix('%').and_then(|n| n.parse::<u32>().ok()) {
        Some(i) if (i as usize) < defined => Ok(ValueId(i)),
        _ => Err(format!("`{s}` is not a value defined above")),
    }
}

/// `f32 [batch,seq,384]`
fn parse_type(s: &str) -> std::result::Result<(DType, Vec<Dim>), Msg> {
    let (dt, shape) = s.split_once(' ').ok_or("expected `dtype [dims]`")?;
    let dtype = DType::from_name(dt).ok_or_else(|| format!("unknown dtype `{dt}`"))?;
    Ok((dtype, dims(shape)?))
}

fn dims(s: &str) -> std::result::Result<Vec<Dim>, Msg> {
    let inner = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).ok_or("expected `[dims]`")?;
    if inner.trim().is_empty() {
        return Ok(vec![]);
    }
    inner.split(',').map(|d| dim(d.trim())).collect()
}

fn dim(d: &str) -> std::result::Result<Dim, Msg> {
    match d {
        "batch" => Ok(Dim::Batch),
        "seq" => Ok(Dim::Seq),
        n => n.parse().map(Dim::Fixed).map_err(|_| format!("`{n}` is not a dim")),
    }
}

fn usizes(s: &str) -> std::result::Result<Vec<usize>, Msg> {
    let inner = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).ok_or("expected `[numbers]`")?;
    if inner.trim().is_empty() {
        return Ok(vec![]);
    }
    inner.split(',').map(|d| d.trim().parse().map_err(|_| format!("`{d}` is not a number"))).collect()
}

fn num<T: std::str::FromStr>(s: &str) -> std::result::Result<T, Msg> {
    s.trim().parse().map_err(|_| format!("`{s}` is not a number"))
}

/// `name(key=value)`'s `value`, for the one attribute `key`.
fn attr<'a>(args: &'a str, key: &str) -> std::result::Result<&'a str, Msg> {
    args.strip_prefix(key).and_then(|a| a.strip_prefix('=')).ok_or_else(|| format!("expected `{key}=`"))
}

/// The op spelled as [`Op::name`] (or [`super::print::op_text`] for constants) spells it.
fn parse_op(s: &str) -> std::result::Result<Op, Msg> {
    let (head, args) = match s.find('(') {
        Some(i) => (&s[..i], s[i + 1..].strip_suffix(')').ok_or("expected `)` after the attributes")?),
        None => (s, ""),
    };
    if let Some(i) = head.strip_prefix("input#") {
        return Ok(Op::Input { index: num(i)? });
    }
    if let Some(i) = head.strip_prefix("weight#") {
        return Ok(Op::Weight { index: num(i)? });
    }
    if let Some(i) = head.strip_prefix("precompiled#") {
        return Ok(Op::Precompiled { output: num(i)? });
    }
    if let Some(flags) = head.strip_prefix("matmul") {
        return match flags {
            "" => Ok(Op::MatMul { transpose_a: false, transpose_b: false }),
            ".ta" => Ok(Op::MatMul { transpose_a: true, transpose_b: false }),
            ".tb" => Ok(Op::MatMul { transpose_a: false, transpose_b: true }),
            ".ta.tb" => Ok(Op::MatMul { transpose_a: true, transpose_b: true }),
            f => Err(format!("unknown matmul flags `{f}`")),
        };
    }
    if let Some(b) = ops::binary::ALL.into_iter().find(|b| Op::Binary(*b).name() == head) {
        return Ok(Op::Binary(b));
    }
    if let Some(u) = ops::unary::ALL.into_iter().find(|u| Op::Unary(*u).name() == head) {
        return Ok(Op::Unary(u));
    }
    if let Some(r) = head.strip_prefix("reduce_") {
        let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]
            .into_iter()
            .find(|o| format!("{o:?}").to_lowercase() == r)
            .ok_or_else(|| format!("unknown reduction `{r}`"))?;
        let (axes, keep) = args.split_once("],").ok_or("expected `axes=[..],keep=..`")?;
        let axes = usizes(&format!("{}]", attr(axes, "axes")?))?;
        let keep_dims = match attr(keep, "keep")? {
            "true" => true,
            "false" => false,
            k => return Err(format!("keep=`{k}` is not a bool")),
        };
        return Ok(Op::Reduce { op, axes, keep_dims });
    }
    Ok(match head {
        "const" if args.starts_with('[') => {
            let inner = args.strip_prefix('[').and_then(|a| a.strip_suffix(']')).ok_or("expected `[values]`")?;
            let values = if inner.trim().is_empty() {
                vec![]
            } else {
                inner.split(',').map(num::<f32>).collect::<std::result::Result<_, _>>()?
            };
            Op::Constant { values }
        }
        "const" => Op::Constant { values: vec![num(args)?] },
        "softmax" => Op::Softmax { axis: num(attr(args, "axis")?)? },
        "layer_norm" => Op::LayerNorm { eps: num(attr(args, "eps")?)? },
        "rms_norm" => Op::RmsNorm { eps: num(attr(args, "eps")?)? },
        "reshape" => Op::Reshape,
        "transpose" => Op::Transpose { perm: usizes(args)? },
        "gather" => Op::Gather,
        "concat" => Op::Concat { axis: num(attr(args, "axis")?)? },
        "slice" => {
            let (axis, range) = args.split_once(',').ok_or("expected `axis=A,S..E`")?;
            let (start, end) = range.split_once("..").ok_or("expected `S..E`")?;
            Op::Slice { axis: num(attr(axis, "axis")?)?, start: num(start)?, end: dim(end)? }
        }
        "where" => Op::Where,
        "cast" => Op::Cast { to: DType::from_name(args).ok_or_else(|| format!("unknown dtype `{args}`"))? },
        _ => return Err(format!("unknown op `{head}`")),
    })
}

/// A Rust-debug-quoted string (what `{:?}` prints) and the text after it.
fn quoted(s: &str) -> std::result::Result<(String, &str), Msg> {
    let body = s.strip_prefix('"').ok_or("expected a quoted name")?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &body[i + 1..])),
            '\\' => match chars.next().map(|(_, c)| c) {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('t') => out.push('\t'),
                Some('0') => out.push('\0'),
                Some(c @ ('\\' | '"' | '\'')) => out.push(c),
                Some('u') => {
                    let rest = &body[i + 2..];
                    let close = rest.find('}').ok_or("bad \\u{..} escape")?;
                    let hex = rest.strip_prefix('{').map(|r| &r[..close - 1]).ok_or("bad \\u{..} escape")?;
                    let ch = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32).ok_or("bad \\u{..} escape")?;
                    out.push(ch);
                    for _ in 0..=close {
                        chars.next();
                    }
                }
                _ => return Err("bad escape in a quoted name".into()),
            },
            c => out.push(c),
        }
    }
    Err("unterminated quoted name".into())
}
