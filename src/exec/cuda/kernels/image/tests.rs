//! Tests of the kernel images: the choice, the CUDA 12 piece per GPU, the fatbin reader, and
//! what the build embeds.

use super::*;

#[test]
fn only_a_refused_image_falls_back_to_nvrtc() {
    for code in [
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "CUDA_ERROR_INVALID_IMAGE",
    ] {
        assert!(driver_refused_image(code), "{code}");
    }
    for code in [
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_INVALID_CONTEXT",
        "CUDA_ERROR_NOT_INITIALIZED",
    ] {
        assert!(!driver_refused_image(code), "{code}");
    }
}

/// A fatbin laid out as nvcc writes them (the entry headers' fields where nvcc puts them),
/// holding the given entries with payloads of `payload` bytes.
fn synthetic_fatbin(entries: &[CodeEntry], payload: usize) -> Vec<u8> {
    let mut body = Vec::new();
    for e in entries {
        let (kind, arch) = match *e {
            CodeEntry::Ptx(a) => (1u16, a),
            CodeEntry::Sass(a) => (2u16, a),
        };
        let mut header = vec![0u8; 64];
        header[0..2].copy_from_slice(&kind.to_le_bytes());
        header[4..8].copy_from_slice(&64u32.to_le_bytes());
        header[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
        header[28..32].copy_from_slice(&arch.to_le_bytes());
        body.extend(header);
        body.extend(vec![0xAB; payload]);
    }
    let mut image = Vec::new();
    image.extend(0xBA55_ED50u32.to_le_bytes());
    image.extend(1u16.to_le_bytes());
    image.extend(16u16.to_le_bytes());
    image.extend((body.len() as u64).to_le_bytes());
    image.extend(body);
    image
}

#[test]
fn a_fatbins_entries_are_read_and_named() {
    let entries = [CodeEntry::Sass(80), CodeEntry::Sass(90), CodeEntry::Ptx(90)];
    let image = synthetic_fatbin(&entries, 100);
    assert_eq!(fatbin_entries(&image).unwrap(), entries);
    assert_eq!(
        describe_entries(&entries),
        "sm_80 + sm_90 SASS, compute_90 PTX"
    );
    // Anything else is refused, never misread: a wrong magic, a cut image, an unknown kind.
    let mut wrong = image.clone();
    wrong[0] ^= 1;
    assert_eq!(fatbin_entries(&wrong), None);
    assert_eq!(fatbin_entries(&image[..image.len() - 1]), None);
    let mut unknown = image.clone();
    unknown[16] = 7;
    assert_eq!(fatbin_entries(&unknown), None);
}

/// What the build embeds, read from the fatbin itself: SASS for every GPU generation the
/// kernels are tuned for (Ampere sm_80, Hopper sm_90) and PTX, so that later GPUs (and
/// drivers that take PTX of this version) compile them.
#[cfg(ringreduce_fatbin)]
#[test]
fn the_embedded_fatbin_carries_sass_for_ampere_and_hopper_and_ptx_beyond() {
    let entries = fatbin_entries(FATBIN).expect("nvcc's fatbin layout");
    for want in [CodeEntry::Sass(80), CodeEntry::Sass(90)] {
        assert!(entries.contains(&want), "{entries:?}");
    }
    assert!(
        entries
            .iter()
            .any(|e| matches!(e, CodeEntry::Ptx(a) if *a >= 80)),
        "{entries:?}"
    );
    println!("embedded: {}", describe_entries(&entries));
}

#[test]
fn build_kind_names_every_image() {
    let kind = build_kind();
    assert_eq!(kind.contains("fatbin"), cfg!(ringreduce_fatbin), "{kind}");
    assert_eq!(
        kind.contains("CUDA 12 drivers"),
        cfg!(ringreduce_cuda12),
        "{kind}"
    );
    if !cfg!(any(ringreduce_fatbin, ringreduce_cuda12)) {
        assert!(kind.starts_with("NVRTC"), "{kind}");
    }
}

/// Every (forced, driver, what the build has) case: a CUDA 13 driver gets nvcc's fatbin, a
/// CUDA 12 driver the CUDA 12 image, a build with neither NVRTC; forcing picks exactly what is
/// asked, and forcing what the build lacks (or nonsense) is an error naming the choices.
#[test]
fn each_driver_gets_the_image_built_for_it() {
    use KernelChoice::*;
    let auto = |driver, fatbin, cuda12| kernel_choice(None, driver, fatbin, cuda12).unwrap();
    assert_eq!(auto(13, true, true), Fatbin);
    assert_eq!(auto(14, true, false), Fatbin);
    assert_eq!(auto(12, true, true), Cuda12);
    assert_eq!(auto(13, false, true), Cuda12);
    // A CUDA 12 driver with only nvcc 13's fatbin: tried, refused, then NVRTC.
    assert_eq!(auto(12, true, false), Fatbin);
    assert_eq!(auto(12, false, false), Nvrtc);
    assert_eq!(
        kernel_choice(Some(" auto "), 12, true, true).unwrap(),
        Cuda12
    );
    assert_eq!(
        kernel_choice(Some("cuda12"), 13, true, true).unwrap(),
        Cuda12
    );
    assert_eq!(
        kernel_choice(Some("fatbin"), 12, true, true).unwrap(),
        Fatbin
    );
    assert_eq!(kernel_choice(Some("nvrtc"), 13, true, true).unwrap(), Nvrtc);
    for (forced, fatbin, cuda12) in [("cuda12", true, false), ("fatbin", false, true)] {
        let err = kernel_choice(Some(forced), 13, fatbin, cuda12).unwrap_err();
        assert!(
            err.to_string().contains("this build has no"),
            "{forced}: {err}"
        );
    }
    let err = kernel_choice(Some("ptx"), 13, true, true).unwrap_err();
    assert!(
        err.to_string().contains("auto, fatbin, cuda12, nvrtc"),
        "{err}"
    );
}

/// A GPU runs SASS of its own major version and a minor no higher than its own (the highest
/// such), else the PTX of an architecture no newer than it; older GPUs get nothing.
#[test]
fn each_gpu_gets_the_cuda12_piece_it_can_run() {
    let image = [CodeEntry::Sass(80), CodeEntry::Sass(90), CodeEntry::Ptx(80)];
    let cases = [
        ((8, 0), Some(CodeEntry::Sass(80))), // A100
        ((8, 6), Some(CodeEntry::Sass(80))), // A10, RTX 30
        ((8, 9), Some(CodeEntry::Sass(80))), // L4, L40, RTX 40
        ((9, 0), Some(CodeEntry::Sass(90))), // H100, H200
        ((10, 0), Some(CodeEntry::Ptx(80))), // B200: the driver compiles the PTX
        ((12, 0), Some(CodeEntry::Ptx(80))), // RTX 50
        ((7, 5), None),                      // T4: older than the image
    ];
    for (capability, want) in cases {
        assert_eq!(cuda12_code_for(capability, &image), want, "{capability:?}");
    }
    // The highest fitting SASS wins over a lower one and over PTX.
    let more = [CodeEntry::Ptx(80), CodeEntry::Sass(80), CodeEntry::Sass(86)];
    assert_eq!(cuda12_code_for((8, 9), &more), Some(CodeEntry::Sass(86)));
    assert_eq!(cuda12_code_for((8, 0), &more), Some(CodeEntry::Sass(80)));
}

/// What the CUDA 12 image embeds, read from its pieces: machine code that says it is for sm_80
/// and sm_90 (an ELF image for NVIDIA GPUs, `EM_CUDA`, its architecture in the low byte of
/// `e_flags`), and PTX for compute_80 of a PTX version CUDA 12 drivers know (8.x; nvcc 13 writes
/// 9.0) — the PTX alone where the build was asked for it (`RINGREDUCE_CUDA12_PTX_ONLY=1`, CI).
#[cfg(ringreduce_cuda12)]
#[test]
fn the_cuda12_image_carries_sass_for_ampere_and_hopper_and_ptx_a_cuda12_driver_reads() {
    const EM_CUDA: u16 = 190;
    let entries: Vec<CodeEntry> = CUDA12_CODE.iter().map(|(e, _)| *e).collect();
    let built: &[CodeEntry] = match CUDA12_PTX_ONLY {
        true => &[CodeEntry::Ptx(80)],
        false => &[CodeEntry::Sass(80), CodeEntry::Sass(90), CodeEntry::Ptx(80)],
    };
    assert_eq!(entries, built);
    assert!(
        CUDA12_NVRTC_RELEASE.starts_with("12."),
        "{CUDA12_NVRTC_RELEASE}"
    );
    for (entry, compressed) in &CUDA12_CODE {
        let code = miniz_oxide::inflate::decompress_to_vec(compressed).unwrap();
        match *entry {
            CodeEntry::Sass(arch) => {
                assert!(code.starts_with(b"\x7fELF"), "{entry:?}");
                let machine = u16::from_le_bytes([code[18], code[19]]);
                let flags = u32::from_le_bytes(code[48..52].try_into().unwrap());
                assert_eq!((machine, flags & 0xff), (EM_CUDA, arch), "{entry:?}");
            }
            CodeEntry::Ptx(arch) => {
                let text = String::from_utf8_lossy(&code);
                let line = |key: &str| {
                    text.lines()
                        .find_map(|l| l.trim().strip_prefix(key).map(str::trim))
                        .unwrap_or_default()
                        .to_string()
                };
                assert_eq!(line(".target"), format!("sm_{arch}"));
                assert!(line(".version").starts_with("8."), "{}", line(".version"));
            }
        }
    }
    println!("CUDA 12 image: {}", describe_entries(&entries));
}
