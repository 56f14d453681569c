//! EAGLE-style draft layers: the head as loaded (`head`), its pass over the target's
//! embedding and rotary tables (`layer`), and the target's LM head rows for a draft vocabulary
//! (`vocab`).

mod head;
mod layer;
mod vocab;

pub use head::EagleHead;
pub(crate) use vocab::DraftVocabHead;
