// blas_in_use(): which BLAS the process's LibTorch calls.
//
// How it works: LibTorch either links a BLAS into itself (PyPI's wheels link
// MKL statically; at::hasMKL() says so) or calls a shared one, on Debian
// whatever `libblas.so.3` resolves to through the alternatives system (the
// netlib reference BLAS, OpenBLAS's pthread or OpenMP build, BLIS, ATLAS).
// For a shared one, the loaded objects are listed (dl_iterate_phdr), the
// first BLAS-looking one is opened again by path (RTLD_NOLOAD: no new load)
// and asked for each optimized implementation's own entry point; dlsym on
// that handle searches the object and its dependencies, which is where
// Debian's libblas.so.3 shims find libopenblas.so.0. A libblas.so* that
// answers to none of them is the reference implementation.

#include <ddp/blas.h>

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

namespace ddp {
namespace {

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// Libraries that provide the BLAS interface, by file name.
bool looks_like_blas(const std::string& name) {
  return starts_with(name, "libblas.so") || starts_with(name, "libopenblas") ||
      starts_with(name, "libmkl_rt") || starts_with(name, "libmkl_core") ||
      starts_with(name, "libblis") || starts_with(name, "libsatlas") || starts_with(name, "libtatlas");
}

std::vector<std::string> loaded_objects() {
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->emplace_back(info->dlpi_name);
        }
        return 0;
      },
      &paths);
  return paths;
}

std::string resolved(const std::string& path) {
  char buffer[PATH_MAX];
  return realpath(path.c_str(), buffer) != nullptr ? std::string(buffer) : path;
}

// Fills `info` from the loaded BLAS library at `path`.
// openblas_get_num_threads, when the BLAS is OpenBLAS; set once by find_blas.
using NumThreadsFn = int (*)();
NumThreadsFn openblas_num_threads = nullptr;

void identify(const std::string& path, BlasInfo& info) {
  info.library = resolved(path);
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  auto has = [&](const char* symbol) { return handle != nullptr && dlsym(handle, symbol) != nullptr; };
  if (has("openblas_get_config")) {
    info.name = "OpenBLAS";
    using ConfigFn = char* (*)();
    const auto config = reinterpret_cast<ConfigFn>(dlsym(handle, "openblas_get_config"));
    const char* text = config();
    info.config = text != nullptr ? text : "";
    openblas_num_threads = reinterpret_cast<NumThreadsFn>(dlsym(handle, "openblas_get_num_threads"));
  } else if (has("MKL_Get_Version_String") || has("mkl_get_version_string")) {
    info.name = "MKL";
  } else if (has("bli_info_get_version_str")) {
    info.name = "BLIS";
    using VersionFn = const char* (*)();
    const char* version = reinterpret_cast<VersionFn>(dlsym(handle, "bli_info_get_version_str"))();
    info.config = version != nullptr ? std::string("BLIS ") + version : "";
  } else if (has("ATL_buildinfo")) {
    info.name = "ATLAS";
  } else if (starts_with(basename_of(path), "libblas.so")) {
    info.name = "reference BLAS";
    info.is_reference = true;
  } else {
    info.name = "unknown";
  }
  if (handle != nullptr) {
    dlclose(handle); // balances the dlopen above; the library stays loaded
  }
}

BlasInfo find_blas() {
  BlasInfo info;
  for (const auto& path : loaded_objects()) {
    if (looks_like_blas(basename_of(path))) {
      identify(path, info);
      return info;
    }
  }
  if (at::hasMKL()) {
    info.name = "MKL";
    info.config = "MKL, linked into LibTorch";
  } else {
    info.name = "unknown";
  }
  return info;
}

} // namespace

std::string BlasInfo::describe() const {
  std::string text = config.empty() ? name : config;
  if (!library.empty()) {
    text += " (" + library + ")";
  }
  return text;
}

std::string BlasInfo::token() const {
  std::string word = name;
  for (char& c : word) {
    if (c == ' ') {
      c = '-';
    }
  }
  return word;
}

const BlasInfo& blas_in_use() {
  static const BlasInfo info = find_blas();
  return info;
}

int blas_num_threads() {
  const BlasInfo& info = blas_in_use(); // sets openblas_num_threads, before any read of it
  if (openblas_num_threads != nullptr) {
    return openblas_num_threads();
  }
  if (info.is_reference) {
    return 1;
  }
  if (info.name == "MKL" && info.library.empty()) {
    return at::get_num_threads();
  }
  return -1;
}

} // namespace ddp
