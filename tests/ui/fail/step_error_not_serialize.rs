use keiro::step;

#[step]
async fn read_config(path: String) -> Result<String, std::io::Error> {
    tokio::fs::read_to_string(path).await
}

fn main() {}
