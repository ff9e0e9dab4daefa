//! Internals for the `udfchain` binary, the tests, the benches and the
//! Python bindings: no part of the public API (hidden from the docs, no
//! stability promise). Each item here has its one public path here; users
//! reach the same behaviour through the crate root and the feature modules.

pub use crate::cache::{LocalCopies, StoreSource};
pub use crate::pipeline::selector::{Strategy, build_strategy};
pub use crate::pipeline::trigger::{Trigger, build_trigger};
pub use crate::plan::WindowPins;
pub use crate::progress::run as run_with_progress;
pub use crate::runtime::cores;
pub use crate::script::{Execution, Kind, Statement, locate, split};
pub use crate::serve::routes::MAX_REQUEST_MESSAGE;
pub use crate::serve::ticket::{FlightTicket, TicketError, TicketKey};
pub use crate::settings::parse_size;
pub use crate::storage::{Downloaded, download_to, missing_path};
pub use crate::util::owner::LOCK_FILE;
pub use crate::util::redact::redact;
