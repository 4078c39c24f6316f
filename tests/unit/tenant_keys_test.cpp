// API keys on disk: E2B's form, only hashes stored (0600), revocation, and a KeyStore that sees
// changes to the file without a restart and refuses everything when the file is damaged.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cellgate/sys/file.hpp"
#include "cellgate/tenants/keys.hpp"

namespace cellgate::tenants {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class TenantKeys : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cellgate-keys-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = keys_path(dir_ + "/state");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, path_;
};

TEST_F(TenantKeys, CreateStoresOnlyTheHashPrivately) {
  auto key = create_key(path_, "alice");
  ASSERT_TRUE(key) << key.error().message;
  EXPECT_TRUE(well_formed_key(*key)) << *key;
  auto text = sys::read_file(path_);
  ASSERT_TRUE(text);
  EXPECT_EQ(text->find(key->substr(4)), std::string::npos) << "the key itself is on disk";
  EXPECT_NE(text->find(key_hash(*key)), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto keys = read_keys(path_);
  ASSERT_TRUE(keys);
  ASSERT_EQ(keys->size(), 1u);
  EXPECT_EQ((*keys)[0].tenant, "alice");
  EXPECT_EQ((*keys)[0].id, key_hash(*key).substr(0, 12));
}

TEST_F(TenantKeys, BadTenantsAndKeysAreRefused) {
  EXPECT_FALSE(create_key(path_, ""));
  EXPECT_FALSE(create_key(path_, "../x"));
  EXPECT_FALSE(create_key(path_, "-x"));
  EXPECT_FALSE(create_key(path_, std::string(65, 'a')));
  EXPECT_TRUE(valid_tenant("team-1.prod_a"));
  EXPECT_FALSE(well_formed_key("e2b_" + std::string(39, 'a')));
  EXPECT_FALSE(well_formed_key("e2b_" + std::string(40, 'A')));
  EXPECT_FALSE(well_formed_key(std::string(44, 'a')));
}

TEST_F(TenantKeys, StoreSeesNewAndRevokedKeysAndFailsClosed) {
  KeyStore store(path_, milliseconds(0));
  auto alice = create_key(path_, "alice");
  auto bob = create_key(path_, "bob");
  ASSERT_TRUE(alice && bob);
  EXPECT_EQ(store.tenant_of(*alice), "alice");
  EXPECT_EQ(store.tenant_of(*bob), "bob");
  EXPECT_EQ(store.tenant_of("e2b_" + std::string(40, '0')), std::nullopt);
  EXPECT_EQ(store.tenant_of(""), std::nullopt);

  auto gone = revoke_keys(path_, key_hash(*alice).substr(0, 12));  // by id
  ASSERT_TRUE(gone);
  EXPECT_EQ(*gone, 1u);
  EXPECT_EQ(store.tenant_of(*alice), std::nullopt);
  EXPECT_EQ(store.tenant_of(*bob), "bob");
  EXPECT_FALSE(revoke_keys(path_, "nothing-like-it"));

  auto bob2 = create_key(path_, "bob");
  ASSERT_TRUE(bob2);
  auto both = revoke_keys(path_, "tenant:bob");
  ASSERT_TRUE(both);
  EXPECT_EQ(*both, 2u);
  EXPECT_TRUE(store.empty());

  // A damaged file: nobody is let in.
  auto carol = create_key(path_, "carol");
  ASSERT_TRUE(carol);
  EXPECT_EQ(store.tenant_of(*carol), "carol");
  std::ofstream(path_, std::ios::trunc) << "{\"keys\": [{\"tenant\": \"carol\"}]} ";
  EXPECT_EQ(store.tenant_of(*carol), std::nullopt);
  fs::remove(path_);
  EXPECT_EQ(store.tenant_of(*carol), std::nullopt);
}

TEST_F(TenantKeys, RecheckIsBounded) {
  KeyStore store(path_, milliseconds(3600 * 1000));
  auto alice = create_key(path_, "alice");
  ASSERT_TRUE(alice);
  EXPECT_EQ(store.tenant_of(*alice), "alice");
  // A revocation is seen at the next recheck, not before: an hour here.
  ASSERT_TRUE(revoke_keys(path_, *alice));
  EXPECT_EQ(store.tenant_of(*alice), "alice") << "re-read before the recheck interval";
}

TEST(TenantKeyFile, ParseRefusesDamage) {
  EXPECT_FALSE(parse_keys("not json"));
  EXPECT_FALSE(parse_keys("[]"));
  EXPECT_FALSE(parse_keys(R"({"keys": [1]})"));
  EXPECT_FALSE(parse_keys(R"({"keys": [{"id": "x", "tenant": "a", "sha256": "00"}]})"));
  const std::string sha(64, 'a');
  auto ok = parse_keys(R"({"keys": [{"id": "aaaaaaaaaaaa", "tenant": "a", "sha256": ")" + sha +
                       R"("}]})");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->size(), 1u);
  auto again = parse_keys(serialize_keys(*ok));
  ASSERT_TRUE(again);
  EXPECT_EQ((*again)[0].sha256, sha);
}

}  // namespace
}  // namespace cellgate::tenants
