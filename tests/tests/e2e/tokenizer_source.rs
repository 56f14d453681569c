//! The router's tokenizer comes from the shard, which has the model's files: a
//! `tokenizer.json` far over gRPC's default 4 MiB message limit crosses, the router
//! tokenizes as the files' tokenizer does, and the served name is the model directory's.

use std::time::Duration;

use tessera_e2e::{Server, fixture, within};
use tessera_text::{ChatMessage, ModelTokenizer};

const MODEL: &str = "tiny-llama";

/// Bytes of whitespace appended to `tokenizer.json` (JSON allows it after the value).
const PADDING: usize = 12 << 20;

#[tokio::test]
async fn a_tokenizer_over_the_default_message_limit_crosses_from_the_shard() {
    let original = fixture(MODEL);
    let copy = tempfile::tempdir().expect("tempdir");
    let model = copy.path().join("tiny-llama-padded");
    std::fs::create_dir(&model).expect("model folder");
    for entry in std::fs::read_dir(&original).expect("fixture folder") {
        let path = entry.expect("fixture entry").path();
        let name = path.file_name().expect("file name");
        std::fs::copy(&path, model.join(name)).expect("copy the fixture");
    }
    let mut tokenizer_json =
        std::fs::read_to_string(model.join("tokenizer.json")).expect("tokenizer.json");
    tokenizer_json.push_str(&" ".repeat(PADDING));
    std::fs::write(model.join("tokenizer.json"), tokenizer_json).expect("padded tokenizer.json");

    let direct = ModelTokenizer::from_hf_dir(&original, &[]).expect("fixture tokenizer");
    let model_id = model.to_str().expect("a UTF-8 temporary path");
    let s = Server::start(model_id, &[]).await;
    within("the checks", Duration::from_secs(60), async {
        let chat = direct
            .chat_template
            .as_ref()
            .expect("the fixture's chat template")
            .render(&[ChatMessage::new("user", "Bonjour, ça va ? 😀")], true)
            .expect("render");
        for text in ["Hello world", "  ünïcödé\tdéjà vu 😀", chat.as_str()] {
            let want: Vec<u64> = direct
                .encode(text, true)
                .expect("encode")
                .into_iter()
                .map(u64::from)
                .collect();
            assert_eq!(s.tokenize(text).await, want, "/tokenize {text:?}");
        }
        let (status, models) = s.get("/v1/models").await;
        assert_eq!(status, 200, "{models}");
        assert_eq!(models["data"][0]["id"], "tiny-llama-padded");
    })
    .await;
}
