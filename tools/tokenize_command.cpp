// `zeroshard tokenize`: text files to llm.c token shards with a SentencePiece model (a LLaMA-style
// `tokenizer.model`), for `data.format: "llmc"` (docs/config.md). One process, no MPI.
//
//   zeroshard tokenize --model tokenizer.model --out train.bin corpus.txt more.txt
//   zeroshard tokenize --model tokenizer.model --out train.bin --split line --shard-tokens 100000000 *.txt
//
// Each document (a whole file, a line or a blank-line-separated paragraph, --split) is encoded on its
// own and, as LLaMA's data are, begins with the model's BOS token (--no-bos leaves it out; --eos
// appends EOS), so the stream marks where documents start the way llm.c's GPT-2 shards do with their
// end-of-text token. Memory: one document's text and ids at a time.
#include <sentencepiece_processor.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "nn/data.h"
#include "tools/commands.h"
#include "tools/options.h"

namespace zs::tools {
namespace {

namespace po = boost::program_options;

constexpr const char* kTokenizeUsage =
    "usage: zeroshard tokenize --model TOKENIZER.model --out OUT.bin [--split file|line|paragraph] [--no-bos] [--eos]\n"
    "                          [--shard-tokens N] INPUT...\n"
    "  Encodes each INPUT text file with the SentencePiece model and writes llm.c's token shard format\n"
    "  (uint16 tokens for a vocabulary of at most 65536, else uint32), for data.format \"llmc\".\n"
    "  --split: what one document is (default file); each starts with BOS (--no-bos: not) and ends with EOS\n"
    "  with --eos. --shard-tokens N: shards of at most N tokens, OUT_000000.bin, OUT_000001.bin, ...\n";

// Writes tokens into one shard or a numbered series of them.
class ShardSeries {
 public:
  ShardSeries(std::string out, uint64_t shard_tokens, int64_t vocab)
      : out_(std::move(out)), shard_tokens_(shard_tokens), vocab_(vocab) {}
  void append(std::span<const int32_t> ids) {
    while (!ids.empty()) {
      if (!writer_) writer_ = std::make_unique<nn::LlmcShardWriter>(next_name(), vocab_);
      const uint64_t room = (shard_tokens_ > 0 ? shard_tokens_ : nn::LlmcShardWriter::kMaxTokens) - writer_->tokens();
      const size_t n = static_cast<size_t>(std::min<uint64_t>(room, ids.size()));
      writer_->append(ids.first(n));
      ids = ids.subspan(n);
      if (!ids.empty()) close();
    }
  }
  // The files written.
  std::vector<std::string> finish() {
    if (!writer_ && written_.empty()) writer_ = std::make_unique<nn::LlmcShardWriter>(next_name(), vocab_);
    if (writer_) close();
    return written_;
  }

 private:
  std::string next_name() const {
    if (shard_tokens_ == 0) return out_;
    const std::string stem = out_.ends_with(".bin") ? out_.substr(0, out_.size() - 4) : out_;
    return fmt::format("{}_{:06}.bin", stem, written_.size());
  }
  void close() {
    writer_->finish();
    written_.push_back(writer_->path());
    writer_.reset();
  }
  std::string out_;
  uint64_t shard_tokens_;
  int64_t vocab_;
  std::unique_ptr<nn::LlmcShardWriter> writer_;
  std::vector<std::string> written_;
};

int run_tokenize(const std::vector<std::string>& args) {
  std::string model_path, out, split = "file";
  uint64_t shard_tokens = 0;
  std::vector<std::string> inputs;
  po::options_description opts("options");
  opts.add_options()("help,h", "show this help")("model", po::value(&model_path), "SentencePiece model file")(
      "out", po::value(&out), "output shard (.bin)")("split", po::value(&split), "file, line or paragraph")(
      "no-bos", "do not start documents with BOS")("eos", "end documents with EOS")(
      "shard-tokens", po::value(&shard_tokens), "tokens per shard (0: one file)")(
      "input", po::value(&inputs), "text files");
  po::positional_options_description pos;
  pos.add("input", -1);
  po::variables_map vm;
  try {
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::command_line_parser(args).options(opts).positional(pos).style(style).run(), vm);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::vector<std::string> names;
    for (const auto& o : opts.options()) names.push_back(o->long_name());
    std::fprintf(stderr, "zeroshard tokenize: %s%s\n%s", e.what(), did_you_mean_option(e.get_option_name(), names).c_str(),
                 kTokenizeUsage);
    return 2;
  } catch (const po::error& e) {
    std::fprintf(stderr, "zeroshard tokenize: %s\n%s", e.what(), kTokenizeUsage);
    return 2;
  }
  if (vm.count("help") != 0) {
    std::fputs(kTokenizeUsage, stdout);
    return 0;
  }
  if (model_path.empty() || out.empty() || inputs.empty()) {
    std::fprintf(stderr, "zeroshard tokenize: --model, --out and at least one input file are required\n%s", kTokenizeUsage);
    return 2;
  }
  if (split != "file" && split != "line" && split != "paragraph") {
    std::fprintf(stderr, "zeroshard tokenize: --split: '%s' is not file, line or paragraph\n%s", split.c_str(),
                 kTokenizeUsage);
    return 2;
  }
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(model_path); !status.ok()) {
    throw IoError(fmt::format("--model: cannot load SentencePiece model '{}': {}", model_path, status.ToString()));
  }
  const int64_t vocab = sp.GetPieceSize();
  const bool bos = vm.count("no-bos") == 0 && sp.bos_id() >= 0, eos = vm.count("eos") != 0 && sp.eos_id() >= 0;
  ShardSeries shards(out, shard_tokens, vocab);
  uint64_t documents = 0, tokens = 0;
  std::vector<int> ids;
  std::vector<int32_t> doc;
  auto encode = [&](const std::string& text, const std::string& file) {
    if (split != "file" && text.find_first_not_of(" \t\r\n") == std::string::npos) return;  // blank: no document
    if (const auto status = sp.Encode(text, &ids); !status.ok()) {
      throw ConfigError(fmt::format("'{}': SentencePiece could not encode document {}: {}", file, documents + 1,
                                    status.ToString()));
    }
    doc.clear();
    if (bos) doc.push_back(sp.bos_id());
    doc.insert(doc.end(), ids.begin(), ids.end());
    if (eos) doc.push_back(sp.eos_id());
    shards.append(doc);
    ++documents;
    tokens += doc.size();
  };
  for (const std::string& file : inputs) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw IoError(fmt::format("zeroshard tokenize: cannot read '{}'", file));
    if (split == "file") {
      encode(std::string(std::istreambuf_iterator<char>(in), {}), file);
      continue;
    }
    std::string line, para;
    while (std::getline(in, line)) {
      if (split == "line") {
        encode(line, file);
      } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
        encode(para, file);
        para.clear();
      } else {
        para += line;
        para += '\n';
      }
    }
    if (split == "paragraph") encode(para, file);
  }
  const std::vector<std::string> files = shards.finish();
  std::printf("tokenized %zu file(s): %llu documents, %llu tokens (vocabulary %lld, %s tokens) -> %s%s\n", inputs.size(),
              static_cast<unsigned long long>(documents), static_cast<unsigned long long>(tokens),
              static_cast<long long>(vocab), vocab <= 65536 ? "uint16" : "uint32", files.front().c_str(),
              files.size() > 1 ? fmt::format(" ... {} ({} shards)", files.back(), files.size()).c_str() : "");
  return 0;
}

}  // namespace

int tokenize_command(const std::vector<std::string>& args) {
  try {
    return run_tokenize(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "zeroshard: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace zs::tools
