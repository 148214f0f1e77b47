//! Identifier newtypes: a VM id can never be passed where a host id is expected.
//!
//! Ids are plain strings on the wire. Their rules (the URL-safe [`crate::validate::ID_CHARSET`] for the
//! ids a client sends) are checked by [`crate::validate`], not here, so that the error can name the
//! field that held the id.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }
    };
}

id_type!(
    /// Identifies one VM for its whole life; allocation is idempotent by it.
    VmId
);
id_type!(
    /// Identifies the customer (subscription) that requested a VM.
    TenantId
);
id_type!(
    /// Identifies a physical host.
    HostId
);
id_type!(
    /// Identifies a rack, the fault domain of its hosts.
    RackId
);
id_type!(
    /// Identifies a cluster of homogeneous hosts.
    ClusterId
);
id_type!(
    /// Identifies an availability zone; each zone has its own allocator.
    ZoneId
);
