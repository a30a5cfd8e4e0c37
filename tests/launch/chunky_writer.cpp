// A rank for ddprun_test: writes numbered lines to stdout and stderr in
// write() calls whose boundaries fall mid-line, so that ddprun has to put the
// lines back together.
//
// Usage: ddprun_test_writer LINES CHUNK_BYTES
// writes "out <RANK> <i> <padding>" to stdout and "err <RANK> <i>" to stderr
// for i in [0, LINES), alternating between the two every CHUNK_BYTES bytes.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n <= 0) {
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s LINES CHUNK_BYTES\n", argv[0]);
    return 2;
  }
  const int lines = std::atoi(argv[1]);
  const size_t chunk = static_cast<size_t>(std::max(1, std::atoi(argv[2])));
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) {
    std::fprintf(stderr, "%s: RANK is not set; run me under ddprun\n", argv[0]);
    return 2;
  }

  std::string out;
  std::string err;
  // Lines of varied length, up to ~200 bytes, so that chunk edges move around.
  for (int i = 0; i < lines; ++i) {
    out += "out " + std::string(rank) + " " + std::to_string(i) + " " +
           std::string(static_cast<size_t>(i % 191), 'x') + "\n";
    err += "err " + std::string(rank) + " " + std::to_string(i) + "\n";
  }
  size_t out_done = 0;
  size_t err_done = 0;
  while (out_done < out.size() || err_done < err.size()) {
    const size_t n_out = std::min(chunk, out.size() - out_done);
    if (!write_all(STDOUT_FILENO, out.data() + out_done, n_out)) {
      return 1;
    }
    out_done += n_out;
    const size_t n_err = std::min(chunk, err.size() - err_done);
    if (!write_all(STDERR_FILENO, err.data() + err_done, n_err)) {
      return 1;
    }
    err_done += n_err;
  }
  return 0;
}
