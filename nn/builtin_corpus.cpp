// The built-in corpus: the frozen text nn/builtin_corpus.txt (ZS_NN_CORPUS_FILE, nn/CMakeLists.txt),
// placed in .rodata with the assembler's .incbin, so it costs no compile time and no startup copy.
// CMake lists the file in OBJECT_DEPENDS, so this object is rebuilt whenever it changes.
#include <cstddef>
#include <string_view>

#include "nn/data.h"

#ifndef ZS_NN_CORPUS_FILE
#error "ZS_NN_CORPUS_FILE must name the corpus file (nn/CMakeLists.txt defines it)"
#endif

__asm__(
    ".pushsection .rodata.zs_nn_corpus, \"a\", @progbits\n"
    ".balign 64\n"
    "zs_nn_corpus_begin:\n"
    ".incbin \"" ZS_NN_CORPUS_FILE "\"\n"
    "zs_nn_corpus_end:\n"
    ".byte 0\n"
    ".balign 8\n"
    "zs_nn_corpus_size:\n"
    ".quad zs_nn_corpus_end - zs_nn_corpus_begin\n"
    ".popsection\n");

extern "C" const char zs_nn_corpus_begin[];
extern "C" const unsigned long long zs_nn_corpus_size;

namespace zs::nn {

std::string_view builtin_corpus() { return {zs_nn_corpus_begin, static_cast<size_t>(zs_nn_corpus_size)}; }

}  // namespace zs::nn
