#include <gflags/gflags.h>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace gflags {
namespace {
struct Flag {
  shim::Kind kind;
  void* storage;
  std::string help, file, default_value;
  bool is_default = true;
};
std::map<std::string, Flag>& registry() {
  static std::map<std::string, Flag> r;
  return r;
}
const char* kind_name(shim::Kind k) {
  switch (k) {
    case shim::kString: return "string";
    case shim::kInt32: return "int32";
    case shim::kInt64: return "int64";
    case shim::kUint32: return "uint32";
    case shim::kUint64: return "uint64";
    case shim::kDouble: return "double";
    case shim::kBool: return "bool";
  }
  return "?";
}
std::string value_of(const Flag& f) {
  switch (f.kind) {
    case shim::kString: return *static_cast<std::string*>(f.storage);
    case shim::kInt32: return std::to_string(*static_cast<int32_t*>(f.storage));
    case shim::kInt64: return std::to_string(*static_cast<int64_t*>(f.storage));
    case shim::kUint32: return std::to_string(*static_cast<uint32_t*>(f.storage));
    case shim::kUint64: return std::to_string(*static_cast<uint64_t*>(f.storage));
    case shim::kDouble: return std::to_string(*static_cast<double*>(f.storage));
    case shim::kBool: return *static_cast<bool*>(f.storage) ? "true" : "false";
  }
  return "";
}
[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "ERROR: %s\n", msg.c_str());
  std::exit(1);
}
bool set_value(const std::string& name, Flag& f, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  switch (f.kind) {
    case shim::kString: *static_cast<std::string*>(f.storage) = v; break;
    case shim::kInt32: {
      long long x = std::strtoll(v.c_str(), &end, 0);
      if (v.empty() || *end || errno || x < INT32_MIN || x > INT32_MAX) return false;
      *static_cast<int32_t*>(f.storage) = static_cast<int32_t>(x);
      break;
    }
    case shim::kInt64: {
      long long x = std::strtoll(v.c_str(), &end, 0);
      if (v.empty() || *end || errno) return false;
      *static_cast<int64_t*>(f.storage) = x;
      break;
    }
    case shim::kUint32: case shim::kUint64: {
      unsigned long long x = std::strtoull(v.c_str(), &end, 0);
      if (v.empty() || *end || errno || v[0] == '-') return false;
      if (f.kind == shim::kUint32) {
        if (x > UINT32_MAX) return false;
        *static_cast<uint32_t*>(f.storage) = static_cast<uint32_t>(x);
      } else {
        *static_cast<uint64_t*>(f.storage) = x;
      }
      break;
    }
    case shim::kDouble: {
      double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end) return false;
      *static_cast<double*>(f.storage) = x;
      break;
    }
    case shim::kBool: {
      std::string s;
      for (char c : v) s.push_back(static_cast<char>(std::tolower(c)));
      if (s == "true" || s == "t" || s == "yes" || s == "y" || s == "1") *static_cast<bool*>(f.storage) = true;
      else if (s == "false" || s == "f" || s == "no" || s == "n" || s == "0") *static_cast<bool*>(f.storage) = false;
      else return false;
      break;
    }
  }
  f.is_default = false;
  (void)name;
  return true;
}
std::string& usage() {
  static std::string u;
  return u;
}
} // namespace

namespace shim {
Registrar::Registrar(const char* name, Kind kind, void* storage, const char* help, const char* file) {
  Flag f{kind, storage, help ? help : "", file ? file : "", "", true};
  f.default_value = value_of(f);
  registry()[name] = f;
}
} // namespace shim

void SetUsageMessage(const std::string& u) { usage() = u; }

void ShowUsageWithFlags(const char* argv0) {
  std::fprintf(stdout, "%s\n", usage().empty() ? argv0 : usage().c_str());
  for (auto& [name, f] : registry())
    std::fprintf(stdout, "  -%s (%s) type: %s default: \"%s\"\n", name.c_str(), f.help.c_str(),
                 kind_name(f.kind), f.default_value.c_str());
}

uint32_t ParseCommandLineFlags(int* argc, char*** argv, bool remove_flags) {
  std::vector<char*> rest;
  rest.push_back((*argv)[0]);
  int i = 1;
  for (; i < *argc; ++i) {
    std::string a = (*argv)[i];
    if (a == "--") { ++i; break; }
    if (a.size() < 2 || a[0] != '-') { rest.push_back((*argv)[i]); continue; }
    std::string body = a.substr(a[1] == '-' ? 2 : 1);
    std::string name = body, value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq); value = body.substr(eq + 1); has_value = true;
    }
    if (name == "help" || name == "helpfull") { ShowUsageWithFlags((*argv)[0]); std::exit(1); }
    auto it = registry().find(name);
    if (it == registry().end() && !has_value && name.rfind("no", 0) == 0) {
      auto nb = registry().find(name.substr(2));
      if (nb != registry().end() && nb->second.kind == shim::kBool) {
        set_value(nb->first, nb->second, "false");
        continue;
      }
    }
    if (it == registry().end()) die("unknown command line flag '" + name + "'");
    Flag& f = it->second;
    if (!has_value) {
      if (f.kind == shim::kBool) { value = "true"; }
      else if (i + 1 < *argc) { value = (*argv)[++i]; }
      else die("flag '" + name + "' is missing its argument");
    }
    if (!set_value(name, f, value))
      die("illegal value '" + value + "' specified for " + kind_name(f.kind) + " flag '" + name + "'");
  }
  for (; i < *argc; ++i) rest.push_back((*argv)[i]);
  if (remove_flags) {
    for (size_t k = 0; k < rest.size(); ++k) (*argv)[k] = rest[k];
    (*argv)[rest.size()] = nullptr;
    *argc = static_cast<int>(rest.size());
  }
  return 1;
}

CommandLineFlagInfo GetCommandLineFlagInfoOrDie(const char* name) {
  auto it = registry().find(name);
  if (it == registry().end()) die(std::string("flag '") + name + "' does not exist");
  const Flag& f = it->second;
  CommandLineFlagInfo info;
  info.name = name; info.type = kind_name(f.kind); info.description = f.help;
  info.current_value = value_of(f); info.default_value = f.default_value;
  info.filename = f.file; info.is_default = f.is_default; info.flag_ptr = f.storage;
  return info;
}
} // namespace gflags
