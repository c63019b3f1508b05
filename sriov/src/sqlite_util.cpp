#include "sqlite_util.hpp"

#include <fmt/format.h>

namespace vrdma::sriov::detail {

Error sqlite_error(sqlite3* db, int rc, std::string_view what) {
  Errc c = Errc::io_error;
  switch (rc & 0xff) {
    case SQLITE_BUSY: case SQLITE_LOCKED: c = Errc::busy; break;
    case SQLITE_CONSTRAINT: c = Errc::busy; break;
    case SQLITE_NOMEM: case SQLITE_FULL: c = Errc::no_memory; break;
    case SQLITE_PERM: case SQLITE_READONLY: case SQLITE_AUTH: c = Errc::access_denied; break;
    case SQLITE_CORRUPT: case SQLITE_NOTADB: c = Errc::bad_state; break;
    case SQLITE_CANTOPEN: c = Errc::not_found; break;
    default: break;
  }
  const char* msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string hint;
  if ((rc & 0xff) == SQLITE_BUSY)
    hint = "; another vrdmactl or backend holds the ledger lock, retry in a moment";
  else if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB)
    hint = "; the ledger file is damaged or not a vrdma ledger: move it aside and run 'vrdmactl vf reconcile'";
  return make_error(c, fmt::format("{}: {}{}", what, msg, hint));
}

Stmt::Stmt(sqlite3* db, std::string_view sql) {
  prc_ = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &s_, nullptr);
  if (prc_ != SQLITE_OK) {
    sqlite3_finalize(s_);
    s_ = nullptr;
  }
}

Status Txn::begin() {
  int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return sqlite_error(db_, rc, "cannot lock the VF ledger");
  open_ = true;
  return {};
}

Status Txn::commit() {
  int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return sqlite_error(db_, rc, "cannot commit to the VF ledger");
  open_ = false;
  return {};
}

Status exec(sqlite3* db, const char* sql, std::string_view what) {
  char* msg = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &msg);
  sqlite3_free(msg);
  if (rc != SQLITE_OK) return sqlite_error(db, rc, what);
  return {};
}

}  // namespace vrdma::sriov::detail
