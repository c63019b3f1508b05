// Private: small RAII wrappers over the SQLite C API for the ledger.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "vrdma/common/result.hpp"

namespace vrdma::sriov::detail {

struct DbClose { void operator()(sqlite3* db) const { sqlite3_close_v2(db); } };
using DbPtr = std::unique_ptr<sqlite3, DbClose>;

// One place that maps SQLite result codes to ours.
Error sqlite_error(sqlite3* db, int rc, std::string_view what);

class Stmt {
 public:
  Stmt(sqlite3* db, std::string_view sql);
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  ~Stmt() { sqlite3_finalize(s_); }

  [[nodiscard]] bool ok() const { return s_ != nullptr; }
  [[nodiscard]] int prepare_rc() const { return prc_; }
  Stmt& bind(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int step() { return sqlite3_step(s_); }  // SQLITE_ROW / SQLITE_DONE / error
  [[nodiscard]] std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<std::size_t>(sqlite3_column_bytes(s_, col)))
             : std::string();
  }
  [[nodiscard]] std::int64_t i64(int col) const { return sqlite3_column_int64(s_, col); }

 private:
  sqlite3_stmt* s_ = nullptr;
  int prc_ = SQLITE_OK;
};

// BEGIN IMMEDIATE on construction (takes the write lock up front, so two allocators serialize
// instead of both reading "free" and then colliding); ROLLBACK unless commit() succeeded.
class Txn {
 public:
  explicit Txn(sqlite3* db) : db_(db) {}
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;
  ~Txn() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Status begin();
  Status commit();

 private:
  sqlite3* db_;
  bool open_ = false;
};

Status exec(sqlite3* db, const char* sql, std::string_view what);

}  // namespace vrdma::sriov::detail
