#include "cublaslt_api.h"

#include <dlfcn.h>

#include <string>

#include "gpu/check.h"

namespace zo::gpu {
namespace {

#if defined(ZO_CUBLASLT_LINKED)

CublasLt load() {
  CublasLt table;
#define ZO_CUBLASLT_LINK(name) table.name = &::name;
  ZO_CUBLASLT_ENTRIES(ZO_CUBLASLT_LINK)
#undef ZO_CUBLASLT_LINK
  return table;
}

#else

[[noreturn]] void fail(const std::string& what) {
  throw CublasError(CUBLAS_STATUS_NOT_INITIALIZED,
                    what + ". The CUDA backend needs cuBLASLt " + std::to_string(CUBLAS_VER_MAJOR) +
                        " for its matrix products: install the CUDA toolkit's cuBLAS (or a " +
                        "PyTorch wheel's nvidia cuBLAS) and put the folder holding it on " +
                        "LD_LIBRARY_PATH, or train with --device host");
}

// By its soname first (LD_LIBRARY_PATH, this program's run path, the ldconfig cache), then in the
// toolkit this program was built against. Never closed: the table lives as long as the process.
void* open_library() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried;
  for (const std::string& path : {soname, std::string(ZO_CUDA_LIBRARY_DIR) + "/" + soname}) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    tried += "; " + path + ": " + (why != nullptr ? why : "not found");
  }
  fail("cannot open cuBLASLt (" + tried.substr(2) + ")");
}

CublasLt load() {
  void* library = open_library();
  CublasLt table;
  // dlsym gives void*; POSIX guarantees it converts to a function pointer.
#define ZO_CUBLASLT_FIND(name)                                             \
  table.name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name)); \
  if (table.name == nullptr) fail("cuBLASLt at hand has no " #name " (too old a version?)");
  ZO_CUBLASLT_ENTRIES(ZO_CUBLASLT_FIND)
#undef ZO_CUBLASLT_FIND
  return table;
}

#endif

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt table = load();
  return table;
}

}  // namespace zo::gpu
