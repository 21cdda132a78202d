// cpu_relax(): the pause between polls of a spin-wait (the worker pool's, comm's handshake and
// shared-memory barriers): it frees the core's pipeline for a sibling hyperthread and saves power
// while the polled word has not moved. Not a yield: the thread keeps its core.
#pragma once

namespace zs {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace zs
