//! A node's attributes, read by name with ONNX's defaults.

use super::proto::{AttributeProto, NodeProto, TensorProto};

pub struct Attrs<'a>(pub &'a [AttributeProto]);

impl<'a> Attrs<'a> {
    pub fn of(n: &'a NodeProto) -> Self {
        Attrs(&n.attribute)
    }
    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.0.iter().find(|a| a.name() == name)
    }
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).and_then(|a| a.i).unwrap_or(default)
    }
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.get(name).and_then(|a| a.f).unwrap_or(default)
    }
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.get(name).map(|a| a.floats.clone())
    }
    pub fn string(&self, name: &str) -> Option<String> {
        self.get(name).and_then(|a| a.s.as_ref()).map(|s| String::from_utf8_lossy(s).into_owned())
    }
    pub fn tensor(&self, name: &str) -> Option<&'a TensorProto> {
        self.get(name).and_then(|a| a.t.as_ref())
    }
    pub fn names(&self) -> Vec<&'a str> {
        self.0.iter().map(|a| a.name()).collect()
    }
}
