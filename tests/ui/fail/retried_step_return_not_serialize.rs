use keiro::step;

#[derive(Debug)]
struct MailError;

#[step(max_attempts = 3)]
async fn email(to: String) -> Result<String, MailError> {
    Ok(to)
}

fn main() {}
