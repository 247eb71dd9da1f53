#include "transport/network_transports.h"

#include "transport/ucx.h"

#include <uct/api/uct.h>

#include <algorithm>
#include <memory>
#include <type_traits>

namespace gradsync::transport {
namespace {

struct ComponentListDeleter {
  void operator()(uct_component_h* list) const { uct_release_component_list(list); }
};
struct MdConfigDeleter {
  void operator()(uct_md_config_t* config) const { uct_config_release(config); }
};
struct MdDeleter {
  void operator()(uct_md_h md) const { uct_md_close(md); }
};
struct ResourceListDeleter {
  void operator()(uct_tl_resource_desc_t* list) const { uct_release_tl_resource_list(list); }
};

// The network transports of one memory domain, appended to `names`.
void add_md_transports(uct_component_h component, const char* md_name,
                       std::vector<std::string>& names) {
  uct_md_config_t* raw_config = nullptr;
  GRADSYNC_UCX_CHECK(uct_md_config_read(component, nullptr, nullptr, &raw_config));
  const std::unique_ptr<uct_md_config_t, MdConfigDeleter> config(raw_config);
  uct_md_h raw_md = nullptr;
  GRADSYNC_UCX_CHECK(uct_md_open(component, md_name, config.get(), &raw_md));
  const std::unique_ptr<std::remove_pointer_t<uct_md_h>, MdDeleter> md(raw_md);
  uct_tl_resource_desc_t* raw_resources = nullptr;
  unsigned count = 0;
  GRADSYNC_UCX_CHECK(uct_md_query_tl_resources(md.get(), &raw_resources, &count));
  const std::unique_ptr<uct_tl_resource_desc_t, ResourceListDeleter> resources(raw_resources);
  for (unsigned i = 0; i < count; ++i) {
    const uct_tl_resource_desc_t& resource = resources.get()[i];
    if (resource.dev_type == UCT_DEVICE_TYPE_NET) names.emplace_back(resource.tl_name);
  }
}

}  // namespace

std::vector<std::string> network_transports() {
  uct_component_h* raw_components = nullptr;
  unsigned component_count = 0;
  GRADSYNC_UCX_CHECK(uct_query_components(&raw_components, &component_count));
  const std::unique_ptr<uct_component_h, ComponentListDeleter> components(raw_components);
  std::vector<std::string> names;
  for (unsigned c = 0; c < component_count; ++c) {
    uct_component_h component = components.get()[c];
    uct_component_attr_t attributes{};
    attributes.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    GRADSYNC_UCX_CHECK(uct_component_query(component, &attributes));
    std::vector<uct_md_resource_desc_t> mds(attributes.md_resource_count);
    attributes.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attributes.md_resources = mds.data();
    GRADSYNC_UCX_CHECK(uct_component_query(component, &attributes));
    for (const uct_md_resource_desc_t& md : mds) add_md_transports(component, md.md_name, names);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool tcp_only(const std::vector<std::string>& network_transports) {
  return !network_transports.empty() &&
         std::all_of(network_transports.begin(), network_transports.end(),
                     [](const std::string& name) { return name == "tcp"; });
}

}  // namespace gradsync::transport
