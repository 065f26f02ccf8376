//! A node's attributes, read by name with ONNX's defaults.
//!
//! An attribute read as another type than the one it declares (an `axis` written as a FLOAT,
//! `perm` as an INT) would read as absent and take the default: a silently wrong answer. Each
//! read checks the declared type and remembers the first mismatch, which the importer turns into
//! an error naming the node ([`Attrs::mismatch`]); the accessors stay plain values so that the op
//! files read attributes as before.

use std::cell::RefCell;

use super::proto::{attribute_proto::AttributeType, AttributeProto, GraphProto, NodeProto, TensorProto};

pub struct Attrs<'a> {
    attrs: &'a [AttributeProto],
    /// The first attribute read as a type it does not declare.
    mismatch: RefCell<Option<String>>,
}

impl<'a> Attrs<'a> {
    pub fn of(n: &'a NodeProto) -> Self {
        Attrs::new(&n.attribute)
    }
    pub fn new(attrs: &'a [AttributeProto]) -> Self {
        Attrs { attrs, mismatch: RefCell::new(None) }
    }
    /// The attribute `name` if it declares type `want` (or none: IR version 1 files leave the
    /// type out, or UNDEFINED).
    fn get_as(&self, name: &str, want: AttributeType) -> Option<&'a AttributeProto> {
        let a = self.attrs.iter().find(|a| a.name() == name)?;
        match a.r#type {
            Some(t) if t != AttributeType::Undefined as i32 && t != want as i32 => {
                let mut m = self.mismatch.borrow_mut();
                if m.is_none() {
                    let declared = AttributeType::try_from(t).map_or(format!("type code {t}"), |d| d.as_str_name().to_string());
                    *m = Some(format!("attribute `{name}` is {declared}, not {}", want.as_str_name()));
                }
                None
            }
            _ => Some(a),
        }
    }
    /// The first attribute read as a type it does not declare, as a message.
    pub fn mismatch(&self) -> Option<String> {
        self.mismatch.borrow().clone()
    }
    pub fn has(&self, name: &str) -> bool {
        self.attrs.iter().any(|a| a.name() == name)
    }
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.get_as(name, AttributeType::Int).and_then(|a| a.i).unwrap_or(default)
    }
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.get_as(name, AttributeType::Float).and_then(|a| a.f).unwrap_or(default)
    }
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get_as(name, AttributeType::Ints).map(|a| a.ints.clone())
    }
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.get_as(name, AttributeType::Floats).map(|a| a.floats.clone())
    }
    pub fn string(&self, name: &str) -> Option<String> {
        self.get_as(name, AttributeType::String).and_then(|a| a.s.as_ref()).map(|s| String::from_utf8_lossy(s).into_owned())
    }
    pub fn strings(&self, name: &str) -> Option<Vec<String>> {
        self.get_as(name, AttributeType::Strings).map(|a| a.strings.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect())
    }
    pub fn tensor(&self, name: &str) -> Option<&'a TensorProto> {
        self.get_as(name, AttributeType::Tensor).and_then(|a| a.t.as_ref())
    }
    pub fn graph(&self, name: &str) -> Option<&'a GraphProto> {
        self.get_as(name, AttributeType::Graph).and_then(|a| a.g.as_ref())
    }
    pub fn names(&self) -> Vec<&'a str> {
        self.attrs.iter().map(|a| a.name()).collect()
    }
}
