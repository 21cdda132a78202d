// A fresh directory for a test's files (swap files, data), removed with its contents at the end.
// Header-only; shared by the offload and engine tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace zs::test {

class TempDir {
 public:
  // The default base is the working directory: ctest runs tests in the build tree, a real disk
  // (O_DIRECT works there, unlike on some tmpfs). Each process gets its own (mkdtemp), so MPI ranks
  // never share one.
  explicit TempDir(const std::string& base = std::filesystem::current_path().string()) {
    std::string tmpl = base + "/zs-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed under " + base);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace zs::test
