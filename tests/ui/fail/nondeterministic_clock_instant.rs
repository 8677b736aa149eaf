use keiro::{step, workflow};

#[step]
async fn fetch(page: u32) -> Vec<u8> {
    vec![page as u8]
}

#[workflow]
async fn crawl(pages: u32) -> u32 {
    let started = std::time::Instant::now();
    let mut fetched = 0;
    for page in 0..pages {
        if started.elapsed().as_secs() > 10 {
            break;
        }
        fetch(page).await;
        fetched += 1;
    }
    fetched
}

fn main() {}
