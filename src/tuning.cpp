// tuning.cpp: the run-time tuning table (see fp4kit/tuning.h).
#include "fp4kit/tuning.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "configs.h"

namespace fp4kit {
namespace {

struct Entry {
  Format format;
  DType act;
  int64_t n, k, m_max;
  int config;
};
struct Table {
  std::string device;
  std::vector<Entry> entries;
};

std::mutex g_mu;
Table g_table;
bool g_env_checked = false;

int config_by_name(const std::string& name) {
  int count = 0;
  const KernelConfig* t = kernel_configs(&count);
  for (int i = 0; i < count; ++i)
    if (name == t[i].name) return t[i].id;
  return -1;
}

// Plain C string handling, no iostreams: the library is loaded into processes (Python interpreters) whose
// C++ runtime state it does not control, and locale-dependent stream facets crashed there.
std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) words.push_back(line.substr(i, j - i));
    i = j;
  }
  return words;
}

bool parse_int(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *v = x;
  return true;
}

Status parse(const std::string& text, const std::string& origin, Table* out) {
  int lineno = 0;
  bool header = false;
  Table t;
  auto bad = [&](const std::string& rule) {
    return Status::Invalid("tuning table " + origin + ", line " + std::to_string(lineno) + ": " + rule);
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const std::vector<std::string> w = split_words(line);
    if (w.empty()) continue;  // blank or comment
    const std::string& first = w[0];
    if (!header) {
      if (first != "fp4kit-tuning" || w.size() != 2 || w[1] != "1") return bad("must start with 'fp4kit-tuning 1'");
      header = true;
      continue;
    }
    if (first == "device") {
      if (w.size() < 2) return bad("'device' needs a device name");
      const size_t b = line.find_first_not_of(" \t", line.find("device") + 6);
      t.device = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
      continue;
    }
    Entry e{};
    if (first == "nvfp4") e.format = Format::kNVFP4;
    else if (first == "mxfp4") e.format = Format::kMXFP4;
    else return bad("format must be nvfp4 or mxfp4 (got '" + first + "')");
    if (w.size() < 6 || !parse_int(w[2], &e.n) || !parse_int(w[3], &e.k) || !parse_int(w[4], &e.m_max))
      return bad("an entry is '<format> <act> <n> <k> <m_max> <config>'");
    if (w.size() > 6) return bad("unexpected text after the config name: '" + w[6] + "'");
    const std::string& act = w[1];
    const std::string& name = w[5];
    if (act == "bf16") e.act = DType::kBF16;
    else if (act == "fp16") e.act = DType::kF16;
    else return bad("act must be bf16 or fp16 (got '" + act + "')");
    if (e.n < 1 || e.k < 1) return bad("n and k must be >= 1");
    if (e.k % group_size(e.format) != 0)
      return bad("k = " + std::to_string(e.k) + " is not a multiple of the " + first + " group size");
    if (e.m_max < 1 || e.m_max > INT32_MAX)
      return bad("m_max must be in [1, 2147483647] (got " + std::to_string(e.m_max) + ")");
    e.config = config_by_name(name);
    if (e.config < 0) return bad("'" + name + "' is not a config of this build's table");
    // A decode config must cover its bucket in one launch (m_max > 64: the 64-token configs, which run
    // larger m in 64-token blocks); a prefill config runs any m in one launch.
    const KernelConfig& c = *find_config(e.config);
    if (!is_prefill(c) && 8 * c.n_tiles < std::min<int64_t>(e.m_max, 64))
      return bad("config " + name + " serves m <= " + std::to_string(8 * c.n_tiles) + " per launch, not m_max = " +
                 std::to_string(e.m_max));
    t.entries.push_back(e);
  }
  if (!header) return Status::Invalid("tuning table " + origin + ": empty (must start with 'fp4kit-tuning 1')");
  if (t.device.empty()) return Status::Invalid("tuning table " + origin + ": no 'device' line");
  *out = t;
  return Status::Ok();
}

// The whole file, or false if it cannot be opened or read.
bool read_file(const char* path, std::string* text) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  text->clear();
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) text->append(buf, got);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  return ok;
}

void load_env_once() {
  // Called with g_mu held.
  if (g_env_checked) return;
  g_env_checked = true;
  const char* path = std::getenv("FP4KIT_TUNING_TABLE");
  if (!path || !*path) return;
  std::string text;
  if (!read_file(path, &text)) return;  // a missing table means the analytic default
  Table t;
  if (parse(text, path, &t).ok()) g_table = t;
}

}  // namespace

Status load_tuning_table_text(const std::string& text, const std::string& origin) {
  Table t;
  FP4KIT_RETURN_IF_ERROR(parse(text, origin, &t));
  std::lock_guard<std::mutex> lock(g_mu);
  g_env_checked = true;
  g_table = t;
  return Status::Ok();
}

Status load_tuning_table(const std::string& path) {
  std::string text;
  if (!read_file(path.c_str(), &text)) return Status::Invalid("path: cannot open tuning table '" + path + "'");
  return load_tuning_table_text(text, "'" + path + "'");
}

void clear_tuning_table() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_env_checked = true;
  g_table = Table();
}

const char* kernel_config_name(int id) {
  const KernelConfig* c = find_config(id);
  return c ? c->name : "unknown";
}

int dispatch_config(Format f, DType act, int64_t m, int64_t n, int64_t k, const std::string& device_name,
                    std::string* why, int cc_major, int sms) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    load_env_once();
    if (!g_table.entries.empty() && g_table.device == device_name) {
      // The bucket of m: the entry with the smallest m_max >= m.
      const Entry* best = nullptr;
      for (const Entry& e : g_table.entries) {
        if (e.format != f || e.act != act || e.n != n || e.k != k || !config_supported(*find_config(e.config), cc_major))
          continue;
        if (e.m_max >= m && (!best || e.m_max < best->m_max)) best = &e;
      }
      // Past the largest bucket: the analytic default (pick_config).
      if (best) {
        if (why)
          *why = std::string("tuning table (") + g_table.device + "): " + find_config(best->config)->name +
                 " for m <= " + std::to_string(best->m_max);
        return best->config;
      }
    }
  }
  return pick_config(m, n, k, why, cc_major, sms, f);
}

}  // namespace fp4kit
