//! The one table of x86 features kiln knows: the name plans record (`is_x86_feature_detected!`
//! spelling), how this machine is probed for it, and the Cranelift flag that lets generated code
//! use it (the compiler reads the flags from here; the runtime only probes). A feature the code
//! generator cannot target has no flag.

/// One x86 feature.
pub struct X86Feature {
    pub name: &'static str,
    /// The Cranelift x64 setting enabling it, if code generation can use it.
    pub cranelift_flag: Option<&'static str>,
    detect: fn() -> bool,
}

impl X86Feature {
    /// Whether this machine has it.
    pub fn detected(&self) -> bool {
        (self.detect)()
    }
}

macro_rules! features {
    ($(($name:tt, $flag:expr)),* $(,)?) => {
        &[$(X86Feature {
            name: $name,
            cranelift_flag: $flag,
            detect: || {
                #[cfg(target_arch = "x86_64")]
                {
                    std::arch::is_x86_feature_detected!($name)
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    false
                }
            },
        }),*]
    };
}

pub const X86_FEATURES: &[X86Feature] = features![
    ("sse2", None),
    ("sse3", Some("has_sse3")),
    ("ssse3", Some("has_ssse3")),
    ("sse4.1", Some("has_sse41")),
    ("sse4.2", Some("has_sse42")),
    ("popcnt", Some("has_popcnt")),
    ("avx", Some("has_avx")),
    ("avx2", Some("has_avx2")),
    ("fma", Some("has_fma")),
    ("bmi1", Some("has_bmi1")),
    ("bmi2", Some("has_bmi2")),
    ("lzcnt", Some("has_lzcnt")),
    ("f16c", None),
    ("avx512f", Some("has_avx512f")),
    ("avx512vl", Some("has_avx512vl")),
    ("avx512dq", Some("has_avx512dq")),
    ("avx512bw", None),
    ("avx512bitalg", Some("has_avx512bitalg")),
    ("avx512vbmi", Some("has_avx512vbmi")),
];

/// Whether this machine has an x86 feature, by its `is_x86_feature_detected!` name (an unknown
/// name: no).
pub fn has_cpu_feature(name: &str) -> bool {
    X86_FEATURES.iter().find(|f| f.name == name).is_some_and(X86Feature::detected)
}
