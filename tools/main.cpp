// zeroshard: the command-line tool (README.md).
//
//   zeroshard train --config FILE [--steps N] [--summary FILE.json] [--save DIR] [--load DIR]
//   mpirun --oversubscribe -np 4 zeroshard train --config FILE
//   zeroshard estimate --params 1.5B --ranks 8
//   zeroshard checkpoint inspect DIR
//   zeroshard tokenize --model tokenizer.model --out train.bin corpus.txt
#include <cstdio>
#include <string>
#include <vector>

#include "core/errors.h"
#include "launch/launch.h"
#include "tools/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: zeroshard <command> [options]\n"
    "\n"
    "commands:\n"
    "  train --config FILE [--steps N] [--summary FILE.json] [--save DIR] [--load DIR [--load-tag TAG]]\n"
    "                                                          train the config's model; --save writes checkpoints\n"
    "                                                          to DIR, --load resumes from one (DIR's latest, or a\n"
    "                                                          tag directory DIR/global_step15)\n"
    "  estimate (--params N | --config FILE) [--ranks R] [--stage 0|1|2|3|all] [--offload none|cpu|nvme] [--json]\n"
    "                                                          memory per rank at each ZeRO stage and tier\n"
    "  project --config FILE --ranks N [--ranks-per-host R] [--network BW,LATENCY[,BURST]] [--json FILE]\n"
    "                                                          predicted step time, MFU and memory of the layouts\n"
    "  checkpoint inspect|consolidate|compare ...              look into, merge and compare checkpoints\n"
    "  tokenize --model TOKENIZER.model --out OUT.bin INPUT... text to llm.c token shards (SentencePiece)\n"
    "\n"
    "Run `zeroshard <command> --help` for a command's options, `zeroshard --version` for the version.\n"
    "Multi-rank runs: mpirun -np R zeroshard train ... (more ranks than cores: mpirun --oversubscribe; as root:\n"
    "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)\n";

}  // namespace

int main(int argc, char** argv) {
  zs::launch::select_blas_kernels(argv);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("zeroshard %s\n", ZS_VERSION);
    return 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "train") return zs::tools::train_command(args);
  if (command == "estimate") return zs::tools::estimate_command(args);
  if (command == "project") return zs::tools::project_command(args);
  if (command == "checkpoint") return zs::tools::checkpoint_command(args);
  if (command == "tokenize") return zs::tools::tokenize_command(args);
  std::fprintf(stderr, "zeroshard: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
