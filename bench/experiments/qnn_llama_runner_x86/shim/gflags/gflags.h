// Minimal gflags-compatible command-line parser, written for this build because neither
// gflags' headers nor a libgflags-dev are on this machine (only the runtime libgflags2.2 .deb
// sits in /var/cache/apt/archives, without gflags.h).  It covers exactly the API
// qnn_llama_runner.cpp uses: DEFINE_{string,int32,int64,uint32,double,bool}, FLAGS_<name>,
// ParseCommandLineFlags(&argc, &argv, remove_flags), GetCommandLineFlagInfoOrDie(name).is_default,
// and --help.  Semantics follow gflags: "--f=v", "--f v", "-f v", "--b"/"--nob" for bools,
// the last occurrence wins, an unknown flag is fatal, "--" ends flag parsing.
#pragma once
#include <cstdint>
#include <string>

namespace gflags {
struct CommandLineFlagInfo {
  std::string name, type, description, current_value, default_value, filename;
  bool has_validator_fn = false;
  bool is_default = true;
  const void* flag_ptr = nullptr;
};
namespace shim {
enum Kind { kString, kInt32, kInt64, kUint32, kUint64, kDouble, kBool };
struct Registrar {
  Registrar(const char* name, Kind kind, void* storage, const char* help, const char* file);
};
} // namespace shim
uint32_t ParseCommandLineFlags(int* argc, char*** argv, bool remove_flags);
CommandLineFlagInfo GetCommandLineFlagInfoOrDie(const char* name);
void SetUsageMessage(const std::string& usage);
void ShowUsageWithFlags(const char* argv0);
} // namespace gflags

#define GFLAGS_SHIM_DEFINE_(type, kind, name, val, txt) \
  type FLAGS_##name = (val);                            \
  static ::gflags::shim::Registrar gflags_shim_reg_##name( \
      #name, ::gflags::shim::kind, &FLAGS_##name, txt, __FILE__)
#define DEFINE_string(name, val, txt) GFLAGS_SHIM_DEFINE_(std::string, kString, name, val, txt)
#define DEFINE_int32(name, val, txt) GFLAGS_SHIM_DEFINE_(int32_t, kInt32, name, val, txt)
#define DEFINE_int64(name, val, txt) GFLAGS_SHIM_DEFINE_(int64_t, kInt64, name, val, txt)
#define DEFINE_uint32(name, val, txt) GFLAGS_SHIM_DEFINE_(uint32_t, kUint32, name, val, txt)
#define DEFINE_uint64(name, val, txt) GFLAGS_SHIM_DEFINE_(uint64_t, kUint64, name, val, txt)
#define DEFINE_double(name, val, txt) GFLAGS_SHIM_DEFINE_(double, kDouble, name, val, txt)
#define DEFINE_bool(name, val, txt) GFLAGS_SHIM_DEFINE_(bool, kBool, name, val, txt)
#define DECLARE_string(name) extern std::string FLAGS_##name
#define DECLARE_int32(name) extern int32_t FLAGS_##name
#define DECLARE_int64(name) extern int64_t FLAGS_##name
#define DECLARE_uint32(name) extern uint32_t FLAGS_##name
#define DECLARE_uint64(name) extern uint64_t FLAGS_##name
#define DECLARE_double(name) extern double FLAGS_##name
#define DECLARE_bool(name) extern bool FLAGS_##name
