// Run-time instruction-set detection and the choice of SIMD kernel.
//
// The build stays baseline x86-64; kernels for wider ISAs live in files compiled with their own flags
// (zs_isa_sources in cmake/ZeroshardHelpers.cmake) and are only called when the CPU and the OS support
// them. Dispatching code asks best_isa() once; tests and benchmarks pass an IsaLevel explicitly
// (e.g. convert_f32_to_bf16(src, dst, IsaLevel::kAvx2)) to exercise every kernel the machine runs.
//
//   for (IsaLevel isa : supported_isas()) run_kernel(isa);
//   IsaLevel isa = best_isa();   // kAvx512 on AVX-512 F/BW/VL/DQ machines
//
// All functions are thread-safe (detection runs once, results are immutable). A program may lower the
// automatic choice once, first thing in main (Note [ISA cap] in cpu_features.cpp):
//
//   memory::set_isa_cap(memory::parse_isa(flag_value, "--isa"));   // before any kernel is chosen
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace zs::memory {

// Ordered: a higher level implies the lower ones are usable too.
enum class IsaLevel : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// AVX-512 F, BW, VL and DQ, plus AVX2, FMA and F16C (what the avx512 kernel files are compiled for),
// enabled by the OS.
bool cpu_has_avx512();
// AVX2, FMA and F16C, enabled by the OS.
bool cpu_has_avx2_f16c();
// cpu_has_avx512() plus AVX512-BF16 (vdpbf16ps: Cooper Lake, Sapphire Rapids, Zen 4/5). Not an
// IsaLevel of its own: users of bf16 products take it when best_isa() is kAvx512 (so --isa=avx2 turns
// it off with the rest of the AVX-512 kernels) and this is true.
bool cpu_has_avx512_bf16();

// Whether kernels of `isa` can run here (kScalar always can).
bool isa_supported(IsaLevel isa);
// The level the library dispatches to by itself: the widest supported level, lowered to the cap when
// one was set. isa_supported() and supported_isas() describe the CPU and ignore the cap.
IsaLevel best_isa();
// Caps best_isa() at `cap` for the rest of the process (a cap above the CPU's best changes nothing).
// Must be called before the first best_isa() (kernels are chosen once and kept), so only an edge does
// this, at start-up; a later call throws InternalError. Thread-safe.
void set_isa_cap(IsaLevel cap);
// Every supported level, scalar first.
std::vector<IsaLevel> supported_isas();
// "scalar", "avx2", "avx512".
std::string_view isa_name(IsaLevel isa);
// Throws ConfigError (naming `what`, e.g. "--isa") for an unknown or unsupported name.
IsaLevel parse_isa(std::string_view name, std::string_view what);

}  // namespace zs::memory
