// tuning.cpp: the run-time tuning table (see fp4kit/tuning.h).
#include "fp4kit/tuning.h"

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
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

Status parse(const std::string& text, const std::string& origin, Table* out) {
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool header = false;
  Table t;
  auto bad = [&](const std::string& rule) {
    return Status::Invalid("tuning table " + origin + ", line " + std::to_string(lineno) + ": " + rule);
  };
  while (std::getline(in, line)) {
    ++lineno;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string first;
    if (!(ls >> first)) continue;  // blank or comment
    if (!header) {
      int version = 0;
      if (first != "fp4kit-tuning" || !(ls >> version) || version != 1)
        return bad("must start with 'fp4kit-tuning 1'");
      header = true;
      continue;
    }
    if (first == "device") {
      std::string rest;
      std::getline(ls, rest);
      const size_t b = rest.find_first_not_of(" \t");
      if (b == std::string::npos) return bad("'device' needs a device name");
      t.device = rest.substr(b, rest.find_last_not_of(" \t\r") - b + 1);
      continue;
    }
    Entry e{};
    if (first == "nvfp4") e.format = Format::kNVFP4;
    else if (first == "mxfp4") e.format = Format::kMXFP4;
    else return bad("format must be nvfp4 or mxfp4 (got '" + first + "')");
    std::string act, name, extra;
    if (!(ls >> act >> e.n >> e.k >> e.m_max >> name))
      return bad("an entry is '<format> <act> <n> <k> <m_max> <config>'");
    if (ls >> extra) return bad("unexpected text after the config name: '" + extra + "'");
    if (act == "bf16") e.act = DType::kBF16;
    else if (act == "fp16") e.act = DType::kF16;
    else return bad("act must be bf16 or fp16 (got '" + act + "')");
    if (e.n < 1 || e.k < 1) return bad("n and k must be >= 1");
    if (e.k % group_size(e.format) != 0)
      return bad("k = " + std::to_string(e.k) + " is not a multiple of the " + first + " group size");
    if (e.m_max < 1 || e.m_max > 64) return bad("m_max must be in [1, 64] (got " + std::to_string(e.m_max) + ")");
    e.config = config_by_name(name);
    if (e.config < 0) return bad("'" + name + "' is not a config of this build's table");
    if (8 * find_config(e.config)->n_tiles < e.m_max)
      return bad("config " + name + " serves m <= " + std::to_string(8 * find_config(e.config)->n_tiles) +
                 " per launch, not m_max = " + std::to_string(e.m_max));
    t.entries.push_back(e);
  }
  if (!header) return Status::Invalid("tuning table " + origin + ": empty (must start with 'fp4kit-tuning 1')");
  if (t.device.empty()) return Status::Invalid("tuning table " + origin + ": no 'device' line");
  *out = t;
  return Status::Ok();
}

void load_env_once() {
  // Called with g_mu held.
  if (g_env_checked) return;
  g_env_checked = true;
  const char* path = std::getenv("FP4KIT_TUNING_TABLE");
  if (!path || !*path) return;
  std::ifstream f(path);
  if (!f) return;  // a missing table means the analytic default
  std::stringstream ss;
  ss << f.rdbuf();
  Table t;
  if (parse(ss.str(), path, &t).ok()) g_table = t;
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
  std::ifstream f(path);
  if (!f) return Status::Invalid("path: cannot open tuning table '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return load_tuning_table_text(ss.str(), "'" + path + "'");
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
                    std::string* why) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    load_env_once();
    if (!g_table.entries.empty() && g_table.device == device_name) {
      const int64_t mb = m > 64 ? 64 : m;
      const Entry* best = nullptr;
      for (const Entry& e : g_table.entries)
        if (e.format == f && e.act == act && e.n == n && e.k == k && e.m_max >= mb &&
            (!best || e.m_max < best->m_max))
          best = &e;
      if (best) {
        if (why)
          *why = std::string("tuning table (") + g_table.device + "): " + find_config(best->config)->name +
                 " for m <= " + std::to_string(best->m_max);
        return best->config;
      }
    }
  }
  return pick_config(m, n, k, why);
}

}  // namespace fp4kit
